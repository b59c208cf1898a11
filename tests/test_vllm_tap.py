"""The tap on vLLM 0.33 (engine/vllm_core/event_tap.py, offload.py) cannot lie quietly.

- After every step of seeded workloads (v0-style shared openings with n > 1, a pool small enough to
  preempt and evict, a tiny hybrid model whose window lets blocks go, vLLM's CPU tier storing,
  evicting and loading), the events derived from the tap are cross-checked against vLLM's own KV
  events (`BlockPool.take_events()`, and what its `update_from_output` took to publish): the same
  blocks stored and removed per block hash, tier and group, with the same parent and tokens; and a
  reducer fed only the tap's events holds vLLM's state: `req_to_blocks` of every group as our block
  tables, each block's ref count, hash, state and group, the free queue and its count, the hash map
  per group, the CPU tier's pool. Every BlockFreed names the group of the block it frees.
- Disabling any one wrapper (a pass-through in its place) makes that cross-check fail or the tap
  refuse the call (TapError): `test_the_cross_check_fails_with_one_wrapper_disabled`.
- A vLLM other than 0.33.x is refused in one line (the engine, and the CLI with exit 2).
- Building and running engines changes no environment variable and no vLLM module global, and a
  `v1` and a `vllm` engine built and run on two threads at once give each the tokens and events
  they give alone.
"""

from __future__ import annotations

import importlib.util
import os
import random
import threading
from collections import Counter

import pytest

from blockviz.model.reducer import CACHED, NULL, USED, ReducerState
from engine import LLM, EngineConfig, SamplingParams
from engine.designs import VLLM, get_design
from engine.events import BlockEvicted, BlockFreed, BlockHashed, OffloadStored
from engine.v1.kv_cache_utils import external_block_hash
from tests.test_engine_v1 import loaded  # noqa: F401 (the tiny GPT-2, a module fixture)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

GiB = 1 << 30
OPENINGS = ("All the world's a stage, and all the men and women merely players.",
            "To be, or not to be, that is the question:", "The quick brown fox")
WORDS = ("stage", "players", "exits", "entrances", "one", "man", "in", "his", "time", "plays", "many", "parts")


# ---------------------------------------------------------------- the cross-check


class Published:
    """Stands in for vLLM's KV event publisher: keeps what Scheduler.update_from_output publishes."""

    def __init__(self) -> None:
        self.events: list = []

    def publish(self, batch) -> None:
        self.events.extend(batch.events)

    def shutdown(self) -> None:
        pass


def as_int(block_hash) -> int:
    return block_hash if isinstance(block_hash, int) else external_block_hash(block_hash)


class TapCrossCheck:
    """vLLM's KV events on (`enable_kv_cache_events` on its GPU pool and CPU tier) and taken after
    every step; the tap's events feed a reducer and are tallied the same way; `check()` compares
    both and the reducer with vLLM's state."""

    def __init__(self, engine) -> None:
        self.engine = engine
        scheduler = engine.scheduler
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.pool = self.manager.block_pool
        self.tier = scheduler.cpu_tier
        self.block_size = engine.config.block_size
        self.pool.enable_kv_cache_events = True
        if self.tier is not None:
            self.tier.manager.enable_kv_cache_events = True
            self.tier.cpu_pool.enable_kv_cache_events = True
        self.published = Published()
        scheduler.vllm.kv_event_publisher = self.published
        self.reducer = ReducerState(self.block_size, engine.budget.num_gpu_blocks, engine.budget.num_cpu_blocks,
                                    "vllm")
        self.ours: list = []  # the tap's events since the last check
        self.kinds: Counter = Counter()  # every event's type, for what the workloads exercised
        self.cpu_stored_ours: Counter = Counter()
        self.cpu_stored_theirs: Counter = Counter()
        engine.events.subscribe(self._on_event)  # before the reducer: a free may clear the block's group
        engine.events.subscribe(self.reducer.apply)
        self.num_checks = 0

    def _on_event(self, event) -> None:
        self.kinds[event.type] += 1
        if isinstance(event, BlockFreed):
            group = self.reducer.pools["gpu"][event.block].group
            assert event.group == group, f"block {event.block} freed in group {event.group}, it is in group {group}"
        self.ours.append(event)

    # ---------------------------------------------------------------- KV events

    def _theirs(self) -> list:
        events, self.published.events = self.published.events, []
        events += self.manager.take_events()
        if self.tier is not None:
            events += list(self.tier.manager.take_events())
        return events

    def _tally_theirs(self, events):
        stored, removed, detail = Counter(), Counter(), {}
        for event in events:
            kind = type(event).__name__
            assert kind != "AllBlocksCleared", "vLLM dropped its whole prefix cache"
            gpu = event.medium == "GPU"
            for index, raw in enumerate(event.block_hashes):
                key = ("gpu", event.group_idx or 0, as_int(raw)) if gpu else ("cpu", None, as_int(raw))
                if kind == "BlockRemoved":
                    removed[key] += 1
                    continue
                stored[key] += 1
                tokens = tuple(event.token_ids[index * self.block_size : (index + 1) * self.block_size])
                parent = event.parent_block_hash if index == 0 else event.block_hashes[index - 1]
                if tokens:  # the CPU tier's stores may carry no metadata
                    detail.setdefault(key, set()).add((None if parent is None else as_int(parent), tokens))
        return stored, removed, detail

    def _tally_ours(self, events):
        stored, removed, detail = Counter(), Counter(), {}
        for event in events:
            if isinstance(event, BlockHashed) and event.device == "gpu":
                key = ("gpu", event.group, event.block_hash)
                stored[key] += 1
                detail.setdefault(key, set()).add((event.parent_hash, tuple(event.token_ids)))
            elif isinstance(event, OffloadStored):
                for block_hash, parent, tokens in zip(event.block_hashes, event.parent_hashes, event.token_ids):
                    key = ("cpu", None, block_hash)
                    stored[key] += 1
                    detail.setdefault(key, set()).add((parent, tuple(tokens)))
            elif isinstance(event, BlockEvicted):
                removed[("gpu", event.group, event.block_hash) if event.device == "gpu"
                        else ("cpu", None, event.block_hash)] += 1
        return stored, removed, detail

    def tap_external(self, key) -> int:
        return self.scheduler.tap.external(key)

    def check_kv_events(self) -> None:
        theirs_stored, theirs_removed, theirs_detail = self._tally_theirs(self._theirs())
        ours_stored, ours_removed, ours_detail = self._tally_ours(self.ours)
        self.ours = []
        gpu = lambda counts: Counter({k: v for k, v in counts.items() if k[0] == "gpu"})  # noqa: E731
        cpu = lambda counts: Counter({k: v for k, v in counts.items() if k[0] == "cpu"})  # noqa: E731
        assert gpu(ours_stored) == gpu(theirs_stored), (
            f"stored on the GPU: tap only {gpu(ours_stored) - gpu(theirs_stored)}, "
            f"vLLM only {gpu(theirs_stored) - gpu(ours_stored)}")
        assert ours_removed == theirs_removed, (
            f"removed: tap only {ours_removed - theirs_removed}, vLLM only {theirs_removed - ours_removed}")
        for key, held in theirs_detail.items():
            assert ours_detail.get(key, held) == held, f"{key}: tap stored {ours_detail.get(key)}, vLLM {held}"
        if self.tier is not None:  # a store is drawn when decided, vLLM publishes it once copied
            self.cpu_stored_ours += cpu(ours_stored)
            self.cpu_stored_theirs += cpu(theirs_stored)
            in_flight = Counter(("cpu", None, self.tap_external(self.tier.gpu_pool.blocks[number].block_hash))
                                for transfer in (*self.tier.manager._pending_finished_stores,
                                                 *self.tier.manager._store_event_to_blocks.values())
                                for number in transfer.gpu_block_ids)
            assert self.cpu_stored_ours == self.cpu_stored_theirs + in_flight, (
                f"stored on the CPU: tap {self.cpu_stored_ours}, vLLM {self.cpu_stored_theirs} + in flight {in_flight}")
        else:
            assert not cpu(theirs_stored) and not cpu(ours_stored)

    # ---------------------------------------------------------------- vLLM's state

    def check_state(self) -> None:
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

        reducer, pool, scheduler = self.reducer, self.pool, self.scheduler
        managers = self.manager.coordinator.single_type_managers
        group_of: dict[int, int] = {}
        for group, single in enumerate(managers):
            theirs = {int(r): [("gpu", b.block_id) for b in blocks] for r, blocks in single.req_to_blocks.items()
                      if blocks}
            ours = {s: t for s, t in reducer.tables_of(group).items() if t}
            assert ours == theirs, f"group {group}: block tables {ours}, vLLM's req_to_blocks {theirs}"
            group_of.update((b.block_id, group) for blocks in single.req_to_blocks.values() for b in blocks
                            if not b.is_null)
        view = reducer.pools["gpu"]
        assert view[0].state == NULL
        assert [b.ref_count for b in view[1:]] == [b.ref_cnt for b in pool.blocks[1:]], "ref counts differ"
        assert reducer.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()], (
            "free queue differs")
        assert reducer.num_free("gpu") == pool.get_num_free_blocks(), "free block count differs"
        for block in pool.blocks[1:]:
            shown = view[block.block_id]
            expected = scheduler.tap.external(block.block_hash) if block.block_hash is not None else None
            assert shown.block_hash == expected, f"block {block.block_id}: hash differs"
            if block.ref_cnt:
                assert shown.state == USED, f"block {block.block_id}: {shown.state}, vLLM holds it"
            else:
                assert shown.state == (CACHED if expected is not None else "free"), f"free block {block.block_id}"
            if block.block_id in group_of:
                assert shown.group == group_of[block.block_id], f"block {block.block_id}: group differs"
        for key in pool.cached_block_hash_to_block._cache:
            found = pool.cached_block_hash_to_block.get_one_block(key)
            block_hash = external_block_hash(get_block_hash(key))
            assert reducer.cached_block(block_hash, get_group_id(key)) == found.block_id, "hash map differs"
        bs = self.block_size
        for request in scheduler.vllm.requests.values():  # each slot holds its token, once it is sampled
            slotted = min(request.num_computed_tokens, request.num_tokens)
            for group in range(len(managers)):
                for index, (_, block_id) in enumerate(reducer.tables_of(group).get(int(request.request_id), ())):
                    if block_id and index * bs < slotted:
                        expected = tuple(request.all_token_ids[index * bs : min(slotted, (index + 1) * bs)])
                        assert tuple(view[block_id].token_ids) == expected, (
                            f"request {request.request_id} block {block_id}: tokens {view[block_id].token_ids}, "
                            f"vLLM's {expected}")
        for request_id, block_ids in scheduler.block_ids.items():  # as vLLM's GPU model runner keeps them
            held = self.manager.get_block_ids(request_id)
            assert [len(ids) for ids in block_ids] == [len(ids) for ids in held]
            for ids, held_ids in zip(block_ids, held):  # a window's let-go slot: the runner keeps the old id
                assert all(a == b or b == 0 for a, b in zip(ids, held_ids)), (ids, held_ids)
        if self.tier is not None:
            from tests.test_vllm_offload import check_cpu_tier_matches_vllm

            check_cpu_tier_matches_vllm(reducer, scheduler)

    def check(self, _engine=None) -> None:
        assert not self.engine.events.errors, self.engine.events.errors
        self.check_kv_events()
        self.check_state()
        self.num_checks += 1

    def done(self) -> None:
        self.check()
        assert self.pool.get_num_free_blocks() == self.pool.num_gpu_blocks - 1
        assert not self.scheduler.vllm.requests


# ---------------------------------------------------------------- seeded workloads


def seeded_requests(seed: int, num_requests: int = 6) -> list[tuple[int, str, SamplingParams]]:
    """(arrival step, prompt, params): prompts opening alike (v0's story: shared openings), some
    with n = 2, arriving over the first steps."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt = rng.choice(OPENINGS) + "".join(" " + rng.choice(WORDS) for _ in range(rng.randrange(0, 5)))
        params = SamplingParams(n=rng.choice((1, 1, 2)), max_tokens=rng.randrange(2, 14), ignore_eos=True)
        requests.append((rng.randrange(0, 6), prompt, params))
    return sorted(requests, key=lambda r: r[0])


def drive(engine, requests, check) -> None:
    """Add each request at its step, step to the end, `check()` after every step."""
    pending = list(requests)
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            engine.add_request(prompt, params)
        engine.step()
        check()
        step += 1
        assert step < 1000, "the workload never ended"


def make_engine(path, loaded_model=None, **options):
    from engine import LLMEngine

    options = {"device": "cpu", "kv_manager": "vllm", "max_num_seqs": 8, **options}
    return LLMEngine(EngineConfig(model=str(path), **options), loaded=loaded_model)


def tiny_block_bytes(block_size: int) -> int:
    """The tiny GPT-2's block: K and V x 2 layers x 4 heads x head_dim 16 x block_size x float32."""
    return 2 * 2 * 4 * 16 * block_size * 4


WORKLOADS = {
    # name: (engine options, seeds)
    "shared": (dict(block_size=4, num_gpu_blocks=48), (0, 1)),
    "preempt": (dict(block_size=2, num_gpu_blocks=30), (2, 3)),
    "cpu": (dict(block_size=2, num_gpu_blocks=30, vllm_options={"kv_offloading_size": 12 * tiny_block_bytes(2) / GiB}),
            (4, 5)),
}


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    from tests.hybrid_fixtures import make_hybrid_llama

    return make_hybrid_llama(tmp_path_factory.mktemp("tiny-hybrid"))


ORDERS = {"async": {}, "sync": {"async_scheduling": False}}  # vLLM 0.33's default order, and --no-async-scheduling


def run_workload(name: str, tiny_gpt2_dir, loaded_model, hybrid_dir, order: str = "async") -> TapCrossCheck:
    """One workload's seeds, each on a fresh engine in scheduling `order`, cross-checked after every
    step; returns the last check (its `kinds` summed over the seeds)."""
    if name == "hybrid":
        options, seeds = dict(block_size=4, num_gpu_blocks=28, max_num_batched_tokens=8,
                              vllm_options={"scheduler_reserve_full_isl": False}), (6, 7)
        path, model = hybrid_dir, None
    else:
        (options, seeds), path, model = WORKLOADS[name], tiny_gpt2_dir, loaded_model
    options = {**options, "vllm_options": {**options.get("vllm_options", {}), **ORDERS[order]}}
    kinds: Counter = Counter()
    for seed in seeds:
        engine = make_engine(path, model, **options)
        # the CPU tier runs synchronously whatever the order asked
        assert engine.async_scheduling is (order == "async" and name != "cpu")
        assert engine.scheduler.vllm.scheduler_config.async_scheduling is engine.async_scheduling
        checked = TapCrossCheck(engine)
        drive(engine, seeded_requests(seed), checked.check)
        checked.done()
        assert checked.num_checks > 0
        kinds += checked.kinds
    checked.kinds = kinds
    return checked


# what each workload must exercise (every wrapper has a workload that runs it)
EXERCISED = {
    "shared": ("prefix_cache_hit", "block_hashed", "block_freed", "sequence_freed"),
    "preempt": ("preempted", "block_evicted", "prefix_cache_hit"),
    "hybrid": ("blocks_skipped", "preempted", "prefix_cache_hit"),
    "cpu": ("offload_store", "offload_load", "block_evicted", "preempted"),
}


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("name", list(EXERCISED))
def test_tap_events_equal_vllms_own_kv_events_and_state_after_every_step(name, order, tiny_gpt2_dir, loaded,
                                                                         hybrid_dir):
    checked = run_workload(name, tiny_gpt2_dir, loaded, hybrid_dir, order)
    missing = [kind for kind in EXERCISED[name] if not checked.kinds[kind]]
    assert not missing, f"the {name} workloads never had {missing}"
    if name == "cpu":
        assert checked.cpu_stored_theirs and checked.kinds["block_evicted"]


# ---------------------------------------------------------------- one wrapper disabled: the check fails


def _pass_through(self, original):
    return original


def _group_pass_through(self, manager, original):
    return original


def _disable(module: str, cls: str, attribute: str, replacement=_pass_through):
    """A disabler: `attribute` of engine/vllm_core/`module`.`cls` replaced (monkeypatch)."""
    def disable(monkeypatch) -> None:
        import importlib

        monkeypatch.setattr(getattr(importlib.import_module(f"engine.vllm_core.{module}"), cls), attribute, replacement)
    return disable


def _disable_evictions(device: str):
    """A disabler of the metrics hook's evictions on one tier's pool, the other's kept."""
    def disable(monkeypatch) -> None:
        from engine.vllm_core.event_tap import VllmEventTap

        real = VllmEventTap.evicted
        monkeypatch.setattr(VllmEventTap, "evicted",
                            lambda self, on, pool, block: None if on == device else real(self, on, pool, block))
    return disable


# what is disabled: (the workload that runs it, its disabler). Not here, as no seeded workload takes their
# paths: KVCacheManager.pop_blocks_for_free (a deferred free, refused: test_a_deferred_free_is_refused_not_drawn),
# the metrics hook's allocation check (test_a_block_freed_outside_every_known_call_is_refused), and in
# tests/test_vllm_tap_paths.py the CPU tier's request_finished (a load's pins released at a request's end)
# and the metrics hook's reset (a prefix cache reset, refused): each of those tests fails with its wrapper off.
DISABLED = {
    "allocate_slots": ("shared", _disable("event_tap", "VllmEventTap", "_allocate_slots")),
    "KVCacheManager.free": ("shared", _disable("event_tap", "VllmEventTap", "_free")),
    "allocate_new_computed_blocks": ("cpu", _disable("event_tap", "VllmEventTap", "_allocate_new_computed_blocks")),
    "allocate_new_blocks": ("shared", _disable("event_tap", "VllmEventTap", "_allocate_new_blocks")),
    "touch": ("shared", _disable("event_tap", "VllmEventTap", "_touch")),
    "cache_full_blocks": ("shared", _disable("event_tap", "VllmEventTap", "_cache_full_blocks")),
    "free_blocks": ("shared", _disable("event_tap", "VllmEventTap", "_free_blocks")),
    "SingleTypeKVCacheManager.free": ("hybrid", _disable("event_tap", "VllmEventTap", "_group_free",
                                                         _group_pass_through)),
    "_remove_blocks_in_range": ("hybrid", _disable("event_tap", "VllmEventTap", "_group_remove_blocks_in_range",
                                                   _group_pass_through)),
    "GPU evictions (metrics hook)": ("preempt", _disable_evictions("gpu")),
    "prepare_store_specs": ("cpu", _disable("offload", "CpuTier", "_prepare_store_specs")),
    "_queue_finished_eager_store": ("cpu", _disable("offload", "CpuTier", "_queue_finished_eager_store")),
    "update_state_after_alloc": ("cpu", _disable("offload", "CpuTier", "_update_state_after_alloc")),
    "update_connector_output": ("cpu", _disable("offload", "CpuTier", "_update_connector_output")),
    "CPU evictions (metrics hook)": ("cpu", _disable_evictions("cpu")),
    # async scheduling: the slots given to tokens in flight, drawn when they are sampled
    "fill_slots": ("shared", _disable("event_tap", "VllmEventTap", "fill_slots", lambda self, *args: None)),
}


@pytest.mark.parametrize("disabled", list(DISABLED))
def test_the_cross_check_fails_with_one_wrapper_disabled(disabled, monkeypatch, tiny_gpt2_dir, loaded, hybrid_dir):
    from engine.vllm_core.event_tap import TapError

    workload, disable = DISABLED[disabled]
    disable(monkeypatch)
    with pytest.raises((AssertionError, TapError)) as raised:
        run_workload(workload, tiny_gpt2_dir, loaded, hybrid_dir)
    print(f"{disabled} disabled: {type(raised.value).__name__}: {str(raised.value).splitlines()[0][:200]}")


def test_a_deferred_free_is_refused_not_drawn(tiny_gpt2_dir, loaded):
    """vLLM's `pop_blocks_for_free` (Scheduler._free_request_blocks under defer_block_free) takes a
    request's blocks out of its tables without freeing them: the tap refuses it."""
    from engine.vllm_core.event_tap import TapError

    engine = make_engine(tiny_gpt2_dir, loaded, block_size=4, num_gpu_blocks=48)
    engine.add_request(OPENINGS[0], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    vllm = engine.scheduler.vllm
    (request,) = vllm.requests.values()
    with pytest.raises(TapError, match="deferred freeing request"):
        vllm.kv_cache_manager.pop_blocks_for_free(request)
    vllm.defer_block_free = True  # as under overlapping batches with a KV-consumer connector
    request.last_sched_seq, vllm.processed_step_seq = 1, 0
    with pytest.raises(TapError):
        vllm._free_request_blocks(request)


def test_a_block_freed_outside_every_known_call_is_refused(tiny_gpt2_dir, loaded):
    from engine.vllm_core.event_tap import TapError

    engine = make_engine(tiny_gpt2_dir, loaded, block_size=4, num_gpu_blocks=48)
    engine.add_request(OPENINGS[0], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    pool = engine.scheduler.block_pool
    held = [b for b in pool.blocks[1:] if b.ref_cnt]
    ref_counts = [b.ref_cnt for b in held]
    with pytest.raises(TapError, match="freed blocks"):
        pool.free_blocks(held[:1])
    with pytest.raises(TapError, match="touched blocks"):
        pool.touch(held[:1])
    assert [b.ref_cnt for b in held] == ref_counts  # refused before vLLM acted
    with pytest.raises(TapError, match="allocated block"):
        pool.get_new_blocks(1)


# ---------------------------------------------------------------- the version pin


@pytest.fixture
def vllm_034(monkeypatch):
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.34.0" if name == VLLM.requires else real(name))


def test_another_vllm_release_is_refused_in_one_line(vllm_034, tiny_gpt2_dir):
    for build in (lambda: EngineConfig(kv_manager="vllm"),
                  lambda: LLM(str(tiny_gpt2_dir), kv_manager="vllm", device="cpu", num_gpu_blocks=16)):
        with pytest.raises(ValueError) as raised:
            build()
        message = str(raised.value)
        assert "\n" not in message and "0.34.0" in message and "0.33" in message, message


def test_another_vllm_release_on_the_command_line_is_one_line_exit_2(vllm_034, tiny_gpt2_dir, capsys):
    from blockviz.cli import main

    assert main(["generate", "--model", str(tiny_gpt2_dir), "--kv-manager", "vllm", "--prompt", "A"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "0.34.0" in lines[0] and "0.33" in lines[0], lines
    assert "Traceback" not in lines[0]


def test_the_installed_release_passes(tiny_gpt2_dir):
    import vllm

    from engine.vllm_core import check_vllm_version

    assert check_vllm_version() == vllm.__version__ and vllm.__version__.startswith("0.33.")


# ---------------------------------------------------------------- nothing process-wide


@pytest.mark.parametrize("hash_algo", ["sha256", "xxhash", "sha256_cbor", "xxhash_cbor"])
def test_the_adapters_hashes_are_vllms_under_pythonhashseed_0_without_setting_it(hash_algo, monkeypatch):
    """make_block_hasher chains from its own NONE_HASH, seeded as vLLM 0.33 seeds it: under
    PYTHONHASHSEED=0 the hashes vLLM's own hasher gives (init_none_hash), with neither the variable
    nor vLLM's global touched."""
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    from engine.vllm_core.config import make_block_hasher

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    environ = dict(os.environ)
    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    ours = make_block_hasher(hash_algo, 4)
    tokens = list(range(100, 123))
    request = Request("0", tokens, VllmSamplingParams(max_tokens=1), None, 0.0, block_hasher=ours)
    assert dict(os.environ) == environ and getattr(kv_cache_utils, "NONE_HASH", None) is none_hash
    hash_fn = get_hash_fn_by_name(hash_algo)
    monkeypatch.setattr(kv_cache_utils, "NONE_HASH", None, raising=False)
    kv_cache_utils.init_none_hash(hash_fn)
    theirs = Request("1", tokens, VllmSamplingParams(max_tokens=1), None, 0.0,
                     block_hasher=kv_cache_utils.get_request_block_hasher(4, hash_fn))
    assert len(request.block_hashes) == 5 and request.block_hashes == theirs.block_hashes


def _run(path, kv_manager, barrier=None, loaded_model=None):
    """Build an engine and generate; its tokens and events (without wall-clock fields)."""
    if barrier is not None:
        barrier.wait()
    llm = LLM(str(path), kv_manager=kv_manager, device="cpu", block_size=4, num_gpu_blocks=40, max_num_seqs=4,
              **({"vllm_options": {"kv_offloading_size": 16 * tiny_block_bytes(4) / GiB}}
                 if get_design(kv_manager).cpu_tier else {}))
    events: list = []
    llm.engine.events.subscribe(events.append)
    prompts = [OPENINGS[0] + " one", OPENINGS[0] + " two", OPENINGS[1], OPENINGS[2] + " jumps"]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))
    tokens = [[c.token_ids for c in o.outputs] for o in outputs]
    plain = [{k: v for k, v in e.to_dict().items() if "time" not in k and not k.endswith("_s")} for e in events]
    return tokens, plain


def test_v1_and_vllm_engines_on_two_threads_at_once_run_as_alone(tiny_gpt2_dir):
    from vllm.v1.core import kv_cache_utils

    environ = dict(os.environ)
    none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    alone = {kv_manager: _run(tiny_gpt2_dir, kv_manager) for kv_manager in ("v1", "vllm")}
    assert dict(os.environ) == environ and getattr(kv_cache_utils, "NONE_HASH", None) is none_hash
    barrier = threading.Barrier(2)
    together: dict = {}
    errors: list = []

    def run(kv_manager):
        try:
            together[kv_manager] = _run(tiny_gpt2_dir, kv_manager, barrier)
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(m,)) for m in ("v1", "vllm")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    for kv_manager in ("v1", "vllm"):
        assert together[kv_manager][0] == alone[kv_manager][0], f"{kv_manager}: tokens differ on a thread"
        assert together[kv_manager][1] == alone[kv_manager][1], f"{kv_manager}: events differ on a thread"
    assert alone["v1"][0] == alone["vllm"][0]
    assert dict(os.environ) == environ and getattr(kv_cache_utils, "NONE_HASH", None) is none_hash

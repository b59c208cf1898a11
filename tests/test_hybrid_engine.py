"""Hybrid checkpoints (full-attention and sliding-window layers) run end to end with one block table
per KV-cache group, under engine/v1 and under vLLM 0.33's own hybrid manager (issue 41).

The checkpoints are tests/test_sliding_window.py's tiny random ones (Llama with `layer_types`,
Qwen2 with `max_window_layers`, Qwen3 with `layer_types`; Mistral's every-layer window is one
sliding-window group). Each run is checked three ways, so that a run that silently fell back to one
full-attention table fails:
- it really had the groups vLLM makes of its layers (engine/v1's and vLLM's the same), and the
  model runner handed each layer its group's metadata;
- a sliding-window group let a block go while its request still ran (a BlockFreed for that request
  before its SequenceFreed, and the null block in the window table mid-request);
- the greedy tokens equal transformers' token for token in float32, across block sizes and windows
  smaller and larger than a block, with prefix caching on (a second request hitting a shared
  prefix) and with a pool small enough to preempt.
Under kv_manager="vllm" the adapter's per-group tables equal vLLM's `get_block_ids` (where a window
let a block go, vLLM's manager holds the null block and its GPU model runner, like our plan, still
the old id: the attention never reads it), and a reducer fed only the events keeps vLLM's ref
counts and free queue after every step.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from blockviz.model.reducer import ReducerState
from engine import LLM, SamplingParams
from engine.designs import VLLM
from engine.events import BlockFreed, BlocksSkipped, PrefixCacheHit, Preempted, SequenceFreed, StepStarted
from engine.v1.kv_cache_interface import get_kv_cache_groups
from test_sliding_window import (  # noqa: F401 (checkpoint_root: a module fixture)
    ARCHS, DEVICE, PROMPTS, checkpoint_root, engine_llm, needs_triton, reference,
)

HYBRID = ("llama", "qwen2", "qwen3")  # full and sliding layers mixed
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
SHARED = PROMPTS[0]
OTHER = "The quick brown fox jumps over the lazy dog again and again and again"


def is_window(spec) -> bool:
    """A sliding-window spec, engine/v1's or vLLM's (whose FullAttentionSpec may carry the window
    of the sliding layers it took in)."""
    return type(spec).__name__ == "SlidingWindowSpec"


def group_kinds(groups) -> list[tuple[list[str], str, int | None]]:
    """Each group's layers, spec class and window: engine/v1's and vLLM's specs alike."""
    return [(list(g.layer_names), type(g.kv_cache_spec).__name__,
             g.kv_cache_spec.sliding_window if is_window(g.kv_cache_spec) else None) for g in groups]


class Watch:
    """The events of one engine, and after every step each running sequence's table per group."""

    def __init__(self, llm: LLM) -> None:
        self.engine = llm.engine
        self.events: list = []
        self.engine.events.subscribe(self.events.append)
        self.window_tables: list[list[int]] = []  # a sliding-window group's table of a running sequence, per step

    def step(self, engine) -> None:
        groups = engine.kv_cache_groups
        windows = [i for i, g in enumerate(groups) if is_window(g.kv_cache_spec)]
        for table in self.tables(engine).values():
            assert len(table) == len(groups)
            self.window_tables.extend(list(table[i]) for i in windows)

    @staticmethod
    def tables(engine) -> dict[int, tuple]:
        """seq id -> its block ids per group, as the block manager holds them."""
        if engine.design is VLLM:
            scheduler = engine.scheduler
            return {int(r): scheduler.kv_cache_manager.get_block_ids(r) for r in scheduler.block_ids}
        manager = engine.kv_manager
        return {seq.seq_id: manager.get_block_ids_per_group(seq) for seq in engine.scheduler.running
                if manager.has_blocks(seq)}

    def freed_mid_request(self) -> list[BlockFreed]:
        """Blocks a request let go while it went on running (a window's): frees not ending in
        the request's SequenceFreed (which closes its frees at a finish or a preemption)."""
        early, run = [], []
        for event in [*self.events, None]:
            if isinstance(event, BlockFreed):
                run.append(event)
                continue
            if run and not (isinstance(event, SequenceFreed) and event.seq_id == run[-1].seq_id):
                early.extend(e for e in run if e.seq_id >= 0)
            run = []
        return early


def run(llm: LLM, arch: str, window: int, prompts, max_tokens: int = 10, watch: Watch | None = None) -> list[list[int]]:
    """Generate greedily and compare with transformers, token for token."""
    watch = watch or Watch(llm)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), on_step=watch.step)
    got = [o.outputs[0].token_ids for o in outputs]
    for prompt, tokens in zip(prompts, got):
        assert tokens == reference(arch, window, tuple(llm.engine.encode(prompt)), max_tokens), (arch, window, prompt)
    return got


def assert_groups_ran(llm: LLM, watch: Watch, hybrid: bool) -> None:
    """The engine ran the groups vLLM makes of its layers (several for a hybrid model, each layer
    given its group's metadata), and a window let a block go mid-request."""
    engine = llm.engine
    groups = engine.kv_cache_groups
    assert group_kinds(groups) == group_kinds(get_kv_cache_groups(engine.kv_cache_specs))
    assert any(kind == "SlidingWindowSpec" for _, kind, _ in group_kinds(groups))
    layer_group_ids = engine.model_runner.layer_group_ids
    if hybrid:
        assert len(groups) > 1 and len(set(layer_group_ids)) == len(groups)
        assert all(str(layer) in groups[g].layer_names for layer, g in enumerate(layer_group_ids))
    else:
        assert len(groups) == 1 and layer_group_ids is None
    cache = engine.cache_engine  # a block holds one page per layer of the largest group, shared across groups
    assert cache.num_pages == max(len(g.layer_names) for g in groups)
    assert cache.num_pages < len(cache.layer_pages) if hybrid else cache.layer_pages == list(range(cache.num_pages))
    assert [cache.layer_pages[int(name)] for g in groups for name in g.layer_names] == [
        position for g in groups for position in range(len(g.layer_names))]
    assert engine.budget.block_bytes == cache.block_bytes == cache.pool_bytes("gpu") // cache.num_gpu_blocks
    assert watch.freed_mid_request(), "no window block went back to the pool mid-request"
    assert any(0 in table for table in watch.window_tables), "no window table held the null block"


# ---------------------------------------------------------------- engine/v1


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("window", [3, 7])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_v1_runs_a_table_per_group_and_frees_the_window_mid_request(arch, window, block_size):
    """Windows 3 and 7 against blocks of 1, 4 and 16, two prompts batched."""
    llm = engine_llm(arch, window, block_size=block_size, num_gpu_blocks=1024 // block_size)
    watch = Watch(llm)
    run(llm, arch, window, PROMPTS, max_tokens=16 if block_size == 16 else 10, watch=watch)
    assert_groups_ran(llm, watch, hybrid=arch in HYBRID)


@pytest.mark.parametrize("window", [3, 7])
@pytest.mark.parametrize("arch", HYBRID)
def test_v1_a_prefix_hit_holds_in_every_group(arch, window):
    """A second request sharing the first one's opening hits the cache in every group (the full
    group's blocks from the start, the window group's where its window needs them) and keeps
    parity."""
    llm = engine_llm(arch, window, block_size=4, enable_prefix_caching=True)
    watch = Watch(llm)
    run(llm, arch, window, [SHARED], watch=watch)
    hits_before = len([e for e in watch.events if isinstance(e, PrefixCacheHit)])
    run(llm, arch, window, [SHARED + " than"], watch=watch)
    assert len([e for e in watch.events if isinstance(e, PrefixCacheHit)]) > hits_before
    assert_groups_ran(llm, watch, hybrid=True)


@pytest.mark.parametrize("arch", HYBRID)
def test_v1_a_small_pool_preempts_a_hybrid_request_and_keeps_parity(arch):
    """Two requests prefilled in chunks of 8 tokens (so a window group holds a few blocks at a time)
    in a pool too small for both to finish, each admitted on its first chunk (no whole-prompt gate,
    which would hold the second back): one is preempted by recompute, its blocks in every group go
    back, and both still give transformers' tokens."""
    llm = engine_llm(arch, 3, block_size=4, num_gpu_blocks=28, max_num_batched_tokens=8, enable_prefix_caching=True,
                     scheduler_reserve_full_isl=False)
    watch = Watch(llm)
    run(llm, arch, 3, [SHARED, OTHER], max_tokens=16, watch=watch)
    assert any(isinstance(e, Preempted) for e in watch.events), "the pool never ran short"
    assert_groups_ran(llm, watch, hybrid=True)


@needs_triton
@pytest.mark.parametrize("arch", HYBRID)
def test_v1_groups_on_the_triton_backend(arch):
    """The triton kernels read each layer's group table (the null block where a window let go),
    on CUDA when lent, else Triton's interpreter on the CPU."""
    llm = engine_llm(arch, 3, block_size=4, device=DEVICE, attention_backend="triton")
    assert llm.engine.model_runner.attention_backend == "triton"
    watch = Watch(llm)
    run(llm, arch, 3, PROMPTS, max_tokens=8, watch=watch)
    assert_groups_ran(llm, watch, hybrid=True)


@needs_triton
def test_graphs_are_skipped_for_several_groups():
    """A CUDA graph's static buffers hold one block table per row: a hybrid model decodes eagerly
    and says why, on the triton backend too, whose window alone would keep its graphs (the
    EagerCapture stand-in runs the capture path on any device)."""
    from engine.cuda_graphs import EagerCapture
    from engine.model_runner import ModelRunner

    engine = engine_llm("qwen2", 3).engine
    runner = ModelRunner(engine.model, engine.cache_engine, 4, engine.device, "triton", engine.kv_cache_groups,
                         capture=EagerCapture())
    assert runner.graph_runner is None
    assert runner.graphs_skipped == "several KV-cache groups: decode steps run eagerly"


# ---------------------------------------------------------------- vLLM's own hybrid manager


class VllmWatch(Watch):
    """Watch, and after every step the adapter's tables and a reducer fed only the events against
    vLLM's own KVCacheManager."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        engine = llm.engine
        self.reducer = ReducerState(engine.config.block_size, engine.budget.num_gpu_blocks, 0, "v1")
        engine.events.subscribe(self.reducer.apply)
        self.num_checks = 0

    def step(self, engine) -> None:
        super().step(engine)
        scheduler = engine.scheduler
        manager = scheduler.kv_cache_manager
        for request_id, block_ids in scheduler.block_ids.items():  # as vLLM's GPU model runner keeps them
            held = manager.get_block_ids(request_id)
            assert [len(ids) for ids in block_ids] == [len(ids) for ids in held]
            for ids, held_ids in zip(block_ids, held):  # a window's let-go slot: the runner keeps the old id
                assert all(a == b or b == 0 for a, b in zip(ids, held_ids)), (ids, held_ids)
        pool = manager.block_pool
        assert [b.ref_count for b in self.reducer.pools["gpu"][1:]] == [b.ref_cnt for b in pool.blocks[1:]]
        assert self.reducer.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        self.num_checks += 1


@needs_vllm
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_vllm_runs_a_hybrid_model_on_its_own_hybrid_manager(arch, block_size):
    """kv_manager="vllm": vLLM groups the layers itself (kv_cache_planning.get_kv_cache_groups, the
    groups engine/v1 makes), its HybridKVCacheCoordinator (unitary for Mistral's one window group)
    keeps the tables, and the tokens equal transformers' and engine/v1's."""
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator, UnitaryKVCacheCoordinator

    window = 3 if block_size > 1 else 7
    options = dict(block_size=block_size, num_gpu_blocks=1024 // block_size)
    llm = engine_llm(arch, window, kv_manager=VLLM.name, **options)
    coordinator = llm.engine.scheduler.kv_cache_manager.coordinator
    assert isinstance(coordinator, HybridKVCacheCoordinator if arch in HYBRID else UnitaryKVCacheCoordinator)
    assert not llm.engine.scheduler.vllm.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
    watch = VllmWatch(llm)
    got = run(llm, arch, window, PROMPTS, watch=watch)
    assert watch.num_checks > 0
    assert_groups_ran(llm, watch, hybrid=arch in HYBRID)
    v1 = engine_llm(arch, window, **options)
    assert group_kinds(v1.engine.kv_cache_groups) == group_kinds(llm.engine.kv_cache_groups)
    assert run(v1, arch, window, PROMPTS) == got


@needs_vllm
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_vllm_hybrid_prefix_hit_and_preemption(arch):
    """A shared opening hit in every group of vLLM's manager, then a pool small enough that vLLM
    preempts (chunks of 8 tokens; vLLM admits without reserving a request's whole prompt):
    tables and reducer equal vLLM's after every step, tokens transformers'."""
    llm = engine_llm(arch, 3, kv_manager=VLLM.name, block_size=4, num_gpu_blocks=28, max_num_batched_tokens=8,
                     enable_prefix_caching=True, vllm_options={"scheduler_reserve_full_isl": False})
    watch = VllmWatch(llm)
    run(llm, arch, 3, [SHARED], watch=watch)
    run(llm, arch, 3, [SHARED + " than", OTHER], max_tokens=16, watch=watch)
    assert any(isinstance(e, PrefixCacheHit) for e in watch.events)
    assert any(isinstance(e, Preempted) for e in watch.events), "the pool never ran short"
    assert_groups_ran(llm, watch, hybrid=True)
    pool = llm.engine.scheduler.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


ORDERS = {"async": {}, "sync": {"async_scheduling": False}}  # vLLM 0.33's default order, --no-async-scheduling


def first_window_free_step(events, window_group: int) -> int:
    """The step whose scheduling let the request's first window block go: 1 + the steps started
    before its BlocksSkipped (a step's allocate_slots runs before its StepStarted)."""
    skipped = next(e for e in events if isinstance(e, BlocksSkipped) and e.group == window_group)
    return 1 + sum(isinstance(e, StepStarted) for e in events[:events.index(skipped)])


@needs_vllm
def test_vllm_async_scheduling_gives_sync_tokens_and_lets_a_window_block_go_a_step_later():
    """kv_manager="vllm" schedules in vLLM 0.33's asynchronous order by default (AsyncScheduler: the
    next step scheduled while the last one's token is in flight); async_scheduling=false gives the
    synchronous order. Greedy tokens equal transformers' under both. A 10-token prompt, window 4,
    blocks of 4: allocate_slots frees the window's first block on the processed-token basis, at the
    second step's scheduling in the synchronous order and the third's in the asynchronous one, as
    the events show; in both, the tables and reducer equal vLLM's after every step."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    prompt = {"prompt_token_ids": [(7 * i + 3) % 200 + 5 for i in range(10)]}
    got, freed_at = {}, {}
    for order, options in ORDERS.items():
        llm = engine_llm("llama", 4, kv_manager=VLLM.name, block_size=4, num_gpu_blocks=32, vllm_options=options)
        engine = llm.engine
        assert engine.async_scheduling is (order == "async")
        assert isinstance(engine.scheduler.vllm, AsyncScheduler) is (order == "async")
        watch = VllmWatch(llm)
        outputs = llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), on_step=watch.step)
        got[order] = outputs[0].outputs[0].token_ids
        window = next(i for i, g in enumerate(engine.kv_cache_groups) if is_window(g.kv_cache_spec))
        freed_at[order] = first_window_free_step(watch.events, window)
        assert watch.num_checks > 0 and not engine.has_unfinished_requests()
        pool = engine.scheduler.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert got["async"] == got["sync"] == reference("llama", 4, tuple(prompt["prompt_token_ids"]), 8)
    assert freed_at == {"sync": 2, "async": 3}


@needs_vllm
def test_vllm_option_disable_hybrid_kv_cache_manager_runs_one_full_group():
    """vLLM's own switch: with the hybrid manager off, vLLM makes every window full attention
    (unify_hybrid_kv_cache_specs): one group, no block leaves mid-request, the tokens unchanged
    (each sliding layer still reads only its window)."""
    llm = engine_llm("qwen2", 3, kv_manager=VLLM.name, vllm_options={"disable_hybrid_kv_cache_manager": True})
    assert group_kinds(llm.engine.kv_cache_groups) == [(["0", "1", "2"], "FullAttentionSpec", None)]
    watch = Watch(llm)
    run(llm, "qwen2", 3, PROMPTS, watch=watch)
    assert not watch.freed_mid_request()


CPU_TIER_PROMPTS = ([SHARED], [OTHER, "Now is the winter of our discontent made glorious summer by this sun of York"],
                    [SHARED + " than"])


def cpu_tier_llm(arch: str) -> LLM:
    """A hybrid run under vLLM's CPU tier (kv_offloading_size, 64 blocks) in a pool small enough to
    preempt, so a preempted request's prefix comes back from the tier."""
    page = engine_llm(arch, 3).engine.kv_cache_specs[0].page_size_bytes
    return engine_llm(arch, 3, kv_manager=VLLM.name, block_size=4, num_gpu_blocks=28, max_num_batched_tokens=8,
                      enable_prefix_caching=True,
                      vllm_options={"scheduler_reserve_full_isl": False, "kv_offloading_size": 64 * page / (1 << 30)})


class CacheCheck:
    """After every step (under kv_manager="vllm"), each scheduled request's cached K/V at every
    position its next token's attention reads, read through the step plan's tables per group:
    full-attention layers all computed positions, sliding ones the last window - 1. `mismatches`
    compares them with an engine/v1 run of the same tokens (a big pool, no CPU tier) read through
    its own tables."""

    def __init__(self, llm: LLM, arch: str, window: int) -> None:
        self.arch, self.window = arch, window
        self.engine = llm.engine
        self.layers = {int(name): (g, group.kv_cache_spec.sliding_window if is_window(group.kv_cache_spec) else None)
                       for g, group in enumerate(self.engine.kv_cache_groups) for name in group.layer_names}
        self.steps = 0
        self.seen: list[tuple[int, str, list[int], dict]] = []  # step, request, tokens computed, {(layer, pos): (k, v)}

    def step(self, engine) -> None:
        self.steps += 1
        scheduler, bs = engine.scheduler, engine.scheduler.block_size
        for request_id, table in scheduler.block_ids.items():
            seq = scheduler.seqs[request_id]
            n = seq.num_computed_tokens
            kv = {}
            for layer, (g, window) in self.layers.items():
                k, v = engine.cache_engine.gpu_cache[layer]
                for pos in range(0 if window is None else max(0, n - window + 1), n):
                    block = table[g][pos // bs]
                    kv[layer, pos] = (k[block, pos % bs].clone(), v[block, pos % bs].clone())
            self.seen.append((self.steps, request_id, seq.get_token_ids()[:n], kv))

    def reference(self, tokens: list[int]) -> dict:
        """(layer, pos) -> K, V after an engine/v1 prefill of `tokens`, read through its tables."""
        llm, kv = engine_llm(self.arch, self.window), {}

        def read(engine) -> None:
            if kv or not engine.scheduler.running or engine.scheduler.running[0].num_computed_tokens < len(tokens):
                return
            seq = engine.scheduler.running[0]
            table, bs = engine.kv_manager.get_block_ids_per_group(seq), engine.cache_engine.block_size
            for layer, (g, _) in self.layers.items():
                k, v = engine.cache_engine.gpu_cache[layer]
                for pos in range(len(tokens)):
                    kv[layer, pos] = (k[table[g][pos // bs], pos % bs], v[table[g][pos // bs], pos % bs])

        llm.generate([{"prompt_token_ids": tokens}], SamplingParams(max_tokens=2, ignore_eos=True), on_step=read)
        return kv

    def mismatches(self) -> list[str]:
        """Step, request, layer and position of every cached K/V the attention read that differs
        from the reference's."""
        longest: dict[str, list[int]] = {}
        for _, request_id, tokens, _ in self.seen:
            if len(tokens) > len(longest.get(request_id, ())):
                longest[request_id] = tokens
        references = {request_id: self.reference(tokens) for request_id, tokens in longest.items()}
        found = []
        for step, request_id, tokens, kv in self.seen:
            assert tokens == longest[request_id][:len(tokens)]
            for (layer, pos), (k, v) in kv.items():
                ref_k, ref_v = references[request_id][layer, pos]
                if not (torch.allclose(k, ref_k, atol=1e-4) and torch.allclose(v, ref_v, atol=1e-4)):
                    found.append(f"step {step} request {request_id} layer {layer} position {pos}")
        return found


@needs_vllm
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_vllm_cpu_tier_swaps_hybrid_blocks_page_by_page(arch):
    """Swap under KV-cache groups: vLLM's CPU tier (kv_offloading_size) stores a hybrid run's blocks
    and loads a preempted request's prefix back; the cache engine moves each block's one page (the
    layers of three groups share it), its CPU pool sized in those blocks, and the tokens stay
    transformers'."""
    from engine.events import OffloadLoaded, OffloadStored

    page = engine_llm(arch, 3).engine.kv_cache_specs[0].page_size_bytes
    llm = cpu_tier_llm(arch)
    cache = llm.engine.cache_engine
    assert (cache.num_pages, cache.num_cpu_blocks, llm.engine.budget.block_bytes) == (1, 64, page)
    assert cache.pool_bytes("cpu") == 64 * page
    watch = Watch(llm)
    for prompts in CPU_TIER_PROMPTS:
        run(llm, arch, 3, prompts, max_tokens=16, watch=watch)
    kinds = {type(e) for e in watch.events}
    assert {OffloadStored, OffloadLoaded, Preempted} <= kinds, kinds


@needs_vllm
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_vllm_cpu_tier_keeps_the_kv_the_attention_reads(arch):
    """After every step of the CPU-tier run, every K/V the next token's attention reads (through
    the plan's tables, a window's last positions included) is the one an engine/v1 prefill of the
    same tokens writes: a store copied before the forward once put a block's stale page in the tier
    under the hash the step was filling it for (a window's freed block reused in the same
    schedule()), and the load of that prefix broke Llama's full layer."""
    from engine.events import OffloadLoaded

    llm = cpu_tier_llm(arch)
    check, watch = CacheCheck(llm, arch, 3), Watch(llm)

    def on_step(engine) -> None:
        watch.step(engine)
        check.step(engine)

    for prompts in CPU_TIER_PROMPTS:
        llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), on_step=on_step)
    loaded = {e.seq_id for e in watch.events if isinstance(e, OffloadLoaded)}
    assert loaded and any(int(request_id) in loaded for _, request_id, _, _ in check.seen)
    assert check.mismatches() == []


@needs_vllm
def test_the_tiny_hybrid_40_token_prompt_is_admitted_or_refused_alike_under_v1_and_vllm():
    """tiny-hybrid, block_size 4, num_gpu_blocks 15 (14 usable), max_num_batched_tokens 8, one
    40-token prompt. Admitted on its first chunk (--no-scheduler-reserve-full-isl) both designs run
    it to the end, the window group letting its blocks go as the prompt is prefilled. Under vLLM
    0.33's default whole-prompt gate both refuse it at once, with the same reason naming each
    KV-cache group's blocks (a window group at its admission cap, as its manager counts it)."""
    import re

    from blockviz.session.tiny_hybrid import tiny_hybrid_checkpoint
    from engine import events as ev

    path = str(tiny_hybrid_checkpoint())
    prompt = {"prompt_token_ids": [(7 * i) % 90 + 3 for i in range(40)]}
    runs = {}
    for kv_manager in ("v1", "vllm"):
        for gate in (False, True):
            llm = LLM(path, kv_manager=kv_manager, block_size=4, num_gpu_blocks=15, max_num_batched_tokens=8,
                      device="cpu", scheduler_reserve_full_isl=gate)
            events, steps = [], []
            llm.engine.events.subscribe(events.append)
            output = llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True),
                                  on_step=lambda engine: steps.append(engine.num_steps))[0].outputs[0]
            managers = llm.engine.scheduler.kv_cache_manager.coordinator.single_type_managers
            caps = [m.max_admission_blocks_per_request for m in managers]
            runs[kv_manager, gate] = (output, len(steps), events, caps, llm.engine.async_scheduling)
    for kv_manager in ("v1", "vllm"):
        output, num_steps, events, _, in_flight = runs[kv_manager, False]
        assert output.finish_reason == "length" and len(output.token_ids) == 4, (kv_manager, output.finish_detail)
        assert in_flight  # vLLM 0.33's default order, the asynchronous one, in both designs
        # synchronously it would be 40 prompt tokens in chunks of 8, then 3 decodes; asynchronously
        # the window's blocks go back a batch later, this pool runs short and the request is
        # preempted (steps that run nothing), and a last step takes the last token back
        assert num_steps > 5 + 3, (kv_manager, num_steps)
        assert any(isinstance(e, ev.Preempted) for e in events)
        assert sum(isinstance(e, ev.StepStarted) for e in events) == 5 + 3
        assert any(isinstance(e, ev.BlocksSkipped) for e in events)
        output, num_steps, events, caps, _ = runs[kv_manager, True]
        window_cap = next(cap for cap in caps if cap is not None)
        assert output.finish_reason == "ignored" and num_steps == 1
        assert re.fullmatch(rf"needs {window_cap + 10} blocks for 40 tokens \({window_cap} \+ 10 in its 2 KV-cache "
                            r"groups\) but the pool has 14 \(block 0 is the null block\)", output.finish_detail), (
            kv_manager, output.finish_detail)
    assert runs["v1", False][0].token_ids == runs["vllm", False][0].token_ids
    assert runs["v1", False][1] == runs["vllm", False][1]  # the same steps, in the same order

"""Pool sizing from the device's memory, as vLLM v1 sizes it (engine/kv_sizing.py
determine_num_blocks / profile_device, engine/mem_utils.py).

On the CPU the device's figures are simulated: `SimulatedDevice` replaces the one memory query
(mem_utils.device_memory) and the engine takes the same path it takes on CUDA: the startup check,
the profile run through the serving attention path, the arithmetic, the one-request check, the
trace header and the title the TUI draws. The `cuda` tests run the same on a real device.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from blockviz.model.trace import check_header_fields, engine_title, load_trace, make_header
from blockviz.session.engine_session import trace_header
from engine import mem_utils
from engine.cache_engine import CacheEngine
from engine.kv_sizing import determine_num_blocks
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.mem_utils import MemorySnapshot
from engine.model_loader import load_model
from test_sliding_window import checkpoint_root, engine_llm  # noqa: F401 (checkpoint_root: a module fixture)
from engine.designs import VLLM

MiB = 1 << 20
UTILIZATION = EngineConfig().gpu_memory_utilization


class SimulatedDevice:
    """A device's memory as a test sets it: `free` and `total` at the first reading; the profile
    run then takes `non_torch` outside torch, keeps `persistent` torch bytes and peaks
    `activations` above what torch held before it. Readings alternate before / after."""

    def __init__(self, total: int, free: int, non_torch: int = 0, activations: int = 0, persistent: int = 0,
                 allocated: int = 3 * MiB):
        self.before = MemorySnapshot(free, total, allocated, allocated)
        self.after = MemorySnapshot(free - non_torch - persistent, total, allocated + persistent,
                                    allocated + activations)
        self.readings = 0

    def __call__(self, device: torch.device) -> MemorySnapshot:
        self.readings += 1
        return self.before if self.readings % 2 else self.after


@pytest.fixture
def simulate(monkeypatch):
    """simulate(device) makes every device (the CPU included) read its memory from `device`."""

    def install(device: SimulatedDevice) -> SimulatedDevice:
        monkeypatch.setattr(mem_utils, "device_memory", lambda _: device)
        return device

    return install


@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    return load_model(str(tiny_gpt2_dir), device="cpu")


def weights_of(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def block_bytes_of(loaded, block_size: int = 16) -> int:
    c = loaded.config
    return CacheEngine.get_cache_block_size(block_size, c.num_layers, c.num_kv_heads, c.head_dim, loaded.dtype)


def test_the_pool_is_what_the_utilization_leaves_after_the_profile(simulate, loaded, tiny_gpt2_dir):
    device = simulate(SimulatedDevice(total=64 * MiB, free=62 * MiB, non_torch=2 * MiB, activations=5 * MiB,
                                      persistent=1 * MiB))
    engine = LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu"), loaded=loaded)
    weights = weights_of(loaded.model)
    requested = math.ceil(64 * MiB * UTILIZATION)
    peak = weights + 5 * MiB  # the weights, then the most the profile run's tensors added
    budget = engine.budget
    assert (budget.source, budget.total_bytes, budget.utilization) == ("profiled", 64 * MiB, UTILIZATION)
    assert (budget.free_bytes, budget.peak_bytes, budget.non_torch_bytes) == (62 * MiB + weights, peak, 2 * MiB)
    assert budget.num_gpu_blocks == (requested - peak - 2 * MiB) // block_bytes_of(loaded)
    assert engine.cache_engine.num_gpu_blocks == budget.num_gpu_blocks and device.readings == 2
    from engine.llm import LLM
    from engine.sequence import SamplingParams

    (output,) = LLM.from_engine(engine).generate(["To be"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(output.outputs[0].token_ids) == 4  # the pool serves

    header = make_header(trace_header(engine))
    check_header_fields(header)
    assert (header["free_bytes"], header["non_torch_bytes"], header["peak_bytes"]) == (
        budget.free_bytes, 2 * MiB, peak)
    title = engine_title(header)
    assert (f"{budget.num_gpu_blocks} GPU / {budget.num_cpu_blocks} CPU blocks (profiled: {UTILIZATION:g} × "
            f"0.1 GiB − 0.0 GiB peak − 0.0 GiB non-torch, 0.1 GiB free)") in title


def test_refused_when_the_requested_memory_is_not_free(simulate, loaded):
    device = simulate(SimulatedDevice(total=80 << 30, free=40 << 30))
    with pytest.raises(ValueError) as refused:
        determine_num_blocks(loaded.model, loaded.config, 16, "cpu", loaded.dtype, 256)
    message = str(refused.value)
    free = mem_utils.format_gib((40 << 30) + weights_of(loaded.model))
    requested = mem_utils.format_gib(math.ceil((80 << 30) * UTILIZATION))
    assert f"{free} free of 80.00 GiB" in message and f"asks for ({requested})" in message
    assert "lower gpu_memory_utilization to 0.5 or less" in message and "num_gpu_blocks" in message
    assert "\n" not in message and device.readings == 1  # refused before the profile run


def test_one_request_of_max_model_len_must_fit(simulate, loaded):
    block_bytes = block_bytes_of(loaded)
    weights = weights_of(loaded.model)
    total = 100 * MiB
    requested = math.ceil(total * UTILIZATION)
    # the profile leaves 5 blocks and a bit; one request of 128 tokens needs 8 blocks of 16
    activations = requested - weights - 5 * block_bytes - 100
    simulate(SimulatedDevice(total=total, free=total - MiB, activations=activations))
    with pytest.raises(ValueError) as refused:
        determine_num_blocks(loaded.model, loaded.config, 16, "cpu", loaded.dtype, 256)
    message = str(refused.value)
    assert loaded.config.max_model_len == 128
    assert message.startswith(f"one request of max_model_len 128 tokens needs {mem_utils.format_gib(8 * block_bytes)}")
    assert f"(8 blocks of {block_bytes:,} bytes)" in message and "a context of 80 tokens fits" in message


def test_the_cli_says_so_in_one_line_and_exits_2(simulate, tiny_gpt2_dir, capsys):
    from blockviz.cli import main

    simulate(SimulatedDevice(total=80 << 30, free=10 << 30))
    code = main(["generate", "--model", str(tiny_gpt2_dir), "--device", "cpu", "--prompt", "To be", "--json"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("blockviz: error: cpu has 10.00 GiB free of 80.00 GiB") and "gpu_memory_utilization" in err


def test_the_profile_run_takes_the_serving_path_at_the_largest_batch(simulate, loaded, monkeypatch):
    steps = []
    forward = type(loaded.model).forward

    def spy(model, input_ids, positions, kv_caches, meta):
        steps.append((meta.query_lens, meta.context_lens, meta.attention_backend, kv_caches is not None))
        return forward(model, input_ids, positions, kv_caches, meta)

    monkeypatch.setattr(type(loaded.model), "forward", spy)
    simulate(SimulatedDevice(total=64 * MiB, free=60 * MiB))
    determine_num_blocks(loaded.model, loaded.config, 16, "cpu", loaded.dtype, 300, max_num_seqs=5)
    (prefill, prefill_ctx, backend, cached), over_cache, decode = steps
    assert prefill == prefill_ctx == (128, 128, 44) and sum(prefill) == 300  # max_num_batched_tokens
    assert over_cache[:2] == ((127,), (128,))  # a prefill over cached blocks: the gather and the mask
    assert decode[:2] == ((1,) * 5, (128,) * 5)  # max_num_seqs decodes at max_model_len
    assert {s[2] for s in steps} == {backend} == {"torch"} and all(s[3] for s in steps)  # the serving backend, a cache


def test_old_headers_load_and_the_new_fields_are_checked(tmp_path):
    header = make_header({"model": "m", "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0,
                          "budget_source": "explicit", "total_bytes": None, "peak_bytes": None})
    assert engine_title(header) == "m · block size 4 · 8 GPU / 0 CPU blocks"  # no origin for a given size
    check_header_fields(header)  # a header without free_bytes / non_torch_bytes passes
    with pytest.raises(ValueError, match="'non_torch_bytes' must be a non-negative integer"):
        check_header_fields({**header, "non_torch_bytes": -1})
    budget = {**header, "budget_source": "budget", "total_bytes": 1 << 30}
    assert engine_title(budget) == "m · block size 4 · 8 GPU / 0 CPU blocks (a 1.0 GiB KV budget)"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_the_tui_title_says_where_the_pool_came_from(simulate, tiny_gpt2_dir, tmp_path):
    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec
    from blockviz.tui.app import BlockvizApp

    simulate(SimulatedDevice(total=32 * MiB, free=30 * MiB, non_torch=MiB, activations=2 * MiB))
    out = tmp_path / "profiled.jsonl"
    record_trace(EngineSpec.of(model=str(tiny_gpt2_dir), device="cpu", prompts=("To be",), max_tokens=2), out)
    trace = load_trace(out)  # the header's new fields pass the reader's checks
    header = trace.header
    assert header["budget_source"] == "profiled" and header["non_torch_bytes"] == MiB
    app = BlockvizApp(trace=trace, deterministic=True, play=False, source_name="profiled")
    async with app.run_test(size=(400, 30)):
        title = str(app.query_one("#title").content)
    assert f"{header['num_gpu_blocks']} GPU / {header['num_cpu_blocks']} CPU blocks (profiled: " in title
    assert f"{UTILIZATION:g} × 0.0 GiB − 0.0 GiB peak − 0.0 GiB non-torch, 0.0 GiB free)" in title


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_device_sizes_its_pool_and_refuses_what_is_not_free(tiny_gpt2_dir):
    loaded = load_model(str(tiny_gpt2_dir), device="cuda")
    budget = determine_num_blocks(loaded.model, loaded.config, 16, "cuda", loaded.dtype, 512,
                                  gpu_memory_utilization=0.5, max_num_seqs=8)
    free, total = torch.cuda.mem_get_info()
    assert budget.source == "profiled" and budget.num_gpu_blocks > 0 and budget.total_bytes == total
    assert budget.peak_bytes >= weights_of(loaded.model) and budget.non_torch_bytes >= 0
    assert budget.num_gpu_blocks * budget.block_bytes <= math.ceil(total * 0.5) - budget.peak_bytes
    hold = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")  # now less than half is free
    with pytest.raises(ValueError, match="lower gpu_memory_utilization"):
        determine_num_blocks(loaded.model, loaded.config, 16, "cuda", loaded.dtype, 512, gpu_memory_utilization=0.5)
    del hold


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_engine_with_no_pool_size_builds_and_generates_on_cuda(tiny_gpt2_factory):
    """The default utilization on a real device: the pool takes what the profile leaves, and the
    first prefill and decodes run after it (the step that failed in cuDNN's SDPA when the pool was
    sized from the total). A wider tiny model and large blocks keep the pool to some 10^5 blocks."""
    import gc

    from engine.llm import LLM
    from engine.sequence import SamplingParams

    path = tiny_gpt2_factory(n_embd=256, n_layer=4)
    llm = LLM(str(path), device="cuda", dtype="float32", block_size=64)
    budget = llm.engine.budget
    assert budget.source == "profiled" and budget.utilization == UTILIZATION
    assert budget.num_gpu_blocks * budget.block_bytes <= math.ceil(budget.total_bytes * UTILIZATION)
    outputs = llm.generate(["To be, or not", "The quick brown fox jumps"], SamplingParams(max_tokens=8, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outputs] == [8, 8]
    del llm, outputs
    gc.collect()
    torch.cuda.empty_cache()  # the next tests get the device back


# ---------------------------------------------------------------- a hybrid geometry (KV-cache groups)

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def allocated_bytes_per_block(engine) -> int:
    """What the cache engine really allocated per device block: its tensors' bytes / blocks."""
    cache = engine.cache_engine
    return cache._gpu_kv.numel() * cache._gpu_kv.element_size() // cache.num_gpu_blocks


def test_a_hybrid_pool_is_sized_by_its_largest_group_and_its_profile(simulate):
    """A hybrid checkpoint (three layers in three groups of one under engine/v1): a block holds one
    page, not three, so the same memory holds three times the blocks; block_bytes is what the cache
    engine allocated per block, and the header's geometry says so."""
    budget_bytes = 96 * 1024 * 10 + 5
    hybrid = engine_llm("qwen2", 3, num_gpu_blocks=None, kv_cache_memory_bytes=budget_bytes).engine
    page = hybrid.kv_cache_specs[0].page_size_bytes
    assert len(hybrid.kv_cache_groups) == 3 and hybrid.cache_engine.num_pages == 1
    assert hybrid.budget.block_bytes == page == allocated_bytes_per_block(hybrid)
    assert hybrid.budget.num_gpu_blocks == budget_bytes // page
    header = make_header(trace_header(hybrid))  # its kv_cache_groups name the three groups
    check_header_fields(header)
    title = engine_title(header)
    assert "2 × 1 layer (one KV-cache group's: the 3 layers form 3 groups sharing the pool) × 2 K/V heads" in title
    assert title.endswith(f"= {page:,} B")

    weights = weights_of(hybrid.model)
    simulate(SimulatedDevice(total=64 * MiB, free=62 * MiB, non_torch=2 * MiB, activations=5 * MiB))
    profiled = engine_llm("qwen2", 3, num_gpu_blocks=None).engine
    requested = math.ceil(64 * MiB * UTILIZATION)
    assert profiled.budget.source == "profiled" and profiled.budget.block_bytes == page
    assert profiled.budget.num_gpu_blocks == (requested - weights - 5 * MiB - 2 * MiB) // page
    assert allocated_bytes_per_block(profiled) == page


def test_one_group_models_allocate_their_block_bytes(loaded, tiny_gpt2_dir):
    """GPT-2 under v0, v1 and a Mistral-like one-window model: every layer's page in a block, and
    block_bytes is exactly what was allocated per block."""
    for kv_manager in ("v0", "v1"):
        engine = LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", num_gpu_blocks=12,
                                        kv_manager=kv_manager), loaded=loaded)
        assert engine.cache_engine.num_pages == loaded.config.num_layers
        assert engine.budget.block_bytes == block_bytes_of(loaded) == allocated_bytes_per_block(engine)
        assert "2 × 2 layers × 4 K/V heads" in engine_title(make_header(trace_header(engine)))
    mistral = engine_llm("mistral", 3).engine
    assert len(mistral.kv_cache_groups) == 1 and mistral.cache_engine.num_pages == 3
    page = mistral.kv_cache_specs[0].page_size_bytes
    assert mistral.budget.block_bytes == 3 * page == allocated_bytes_per_block(mistral)


@needs_vllm
@pytest.mark.parametrize("kinds", ["wfwwfw", "fwwfwww", "wfw"])
def test_vllm_plans_the_same_blocks_and_sharing_for_the_same_memory(kinds):
    """vLLM 0.33's own planner (kv_cache_planning.get_kv_cache_config_from_groups) over the groups
    vLLM makes of the same layer specs and the same memory: as many blocks as our sizing, one
    backing allocation of our pool's bytes, and each group's KVCacheTensor puts its l-th layer at
    page l, the cache engine's page of that layer. Group sizes 2/2/2, 3/4 and 1/1/1."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups

    from engine.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, get_kv_cache_groups
    from engine.vllm_core.config import vllm_kv_cache_groups
    vllm_config = engine_llm("qwen2", 3, kv_manager=VLLM.name).engine.vllm_config  # its layout: our cache engine's
    shape = dict(num_kv_heads=2, head_size=16, dtype=torch.float32)
    specs = [FullAttentionSpec(4, **shape) if kind == "f" else SlidingWindowSpec(4, **shape, sliding_window=3)
             for kind in kinds]
    ours, theirs = get_kv_cache_groups(specs), vllm_kv_cache_groups(vllm_config, specs)
    assert [g.layer_names for g in ours] == [g.layer_names for g in theirs]
    memory = 1000 * specs[0].page_size_bytes + 123

    class ModelConfig:
        num_layers, num_kv_heads, head_dim, max_model_len = len(kinds), 2, 16, 64

    budget = determine_num_blocks(None, ModelConfig, 4, "cpu", torch.float32, 64, kv_cache_memory_bytes=memory,
                                  kv_cache_groups=ours)
    cache = CacheEngine(len(kinds), 2, 16, 4, budget.num_gpu_blocks, 0, "cpu", torch.float32, ours)
    planned = get_kv_cache_config_from_groups(vllm_config, theirs, memory)
    assert planned.num_blocks == budget.num_gpu_blocks == cache.num_gpu_blocks
    assert budget.block_bytes == cache.block_bytes == max(len(g.layer_names) for g in ours) * specs[0].page_size_bytes
    assert {t.size for t in planned.kv_cache_tensors} == {cache.pool_bytes("gpu")}
    for tensor in planned.kv_cache_tensors:  # every group's tensor from byte 0, layer l at l x layer_stride
        assert tensor.offset == 0 and tensor.layer_stride == cache.pool_bytes("gpu") // cache.num_pages
        assert [cache.layer_pages[int(name)] for name in tensor.layers] == list(range(len(tensor.layers)))
        for position, name in enumerate(tensor.layers):  # the same bytes: the view's offset in the allocation
            k = cache.gpu_cache[int(name)][0]
            assert (k.data_ptr() - cache._gpu_kv.data_ptr()) == position * tensor.layer_stride
    if len(ours) > 1:
        assert cache.num_pages < len(kinds)

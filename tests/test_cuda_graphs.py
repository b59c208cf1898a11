"""CUDA graphs for decode (engine/cuda_graphs.py): the batch padding, the static buffers, the
padded rows' neutrality, and the graph path against the eager one.

Without a GPU the graph path runs through `EagerCapture`, the stand-in that runs the captured
function (the padded forward over the static buffers) where a graph would be replayed: same
tokens, same events, same K/V digests as the eager path. The `cuda` cases capture real graphs.
Triton kernels run on CPU tensors under TRITON_INTERPRET=1, set here before they are imported
(as tests/test_kernels.py does).
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from engine import LLM, SamplingParams  # noqa: E402
from engine.attention import AttentionMetadata, paged_attention, reference_paged_attention, write_to_cache  # noqa: E402
from engine.attention import write_to_cache_skipping_padding  # noqa: E402
from engine.cache_engine import CacheEngine  # noqa: E402
from engine.cuda_graphs import CUDAGraphCapture, EagerCapture, capture_sizes, padded_batch_size  # noqa: E402
from engine.kernels import triton_available  # noqa: E402
from engine.model_runner import ModelRunner  # noqa: E402
from engine.designs import V1

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install triton)")
skip_without_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(CUDA, reason="with CUDA the kernels compile for the GPU: "
                                                                     "the cuda cases run them")),
           pytest.param("cuda", marks=[pytest.mark.cuda, skip_without_cuda])]
PROMPTS = ["To be, or not to be, that is the question:", "The quick brown fox", "KV",
           "All the world's a stage, and all the men", "Paged attention keeps", "Whether 'tis nobler",
           "To be", "The quick", "merely players."]


def with_graphs(llm: LLM, capture=None) -> list[int]:
    """Give `llm`'s engine a model runner with decode graphs captured by `capture` (the stand-in
    by default); returns a list that grows by the batch size of each replay."""
    engine = llm.engine
    runner = ModelRunner(engine.model, engine.cache_engine, engine.config.block_size, engine.device,
                         engine.config.attention_backend, max_num_seqs=engine.config.max_num_seqs,
                         capture=capture or EagerCapture())
    replays: list[int] = []
    graphs = runner.graph_runner.graphs
    for size, replay in list(graphs.items()):
        graphs[size] = lambda size=size, replay=replay: (replays.append(size), replay())
    engine.model_runner = runner
    return replays


def run(llm: LLM, prompts=PROMPTS, max_tokens: int = 14) -> tuple[list[list[int]], list[dict]]:
    """(tokens per request, every event as a dict without the step's wall time)."""
    events = []
    llm.events.subscribe(events.append)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    dicts = [{k: v for k, v in e.to_dict().items() if k != "duration_s"} for e in events]
    return [o.outputs[0].token_ids for o in outputs], dicts


# ---------------------------------------------------------------- sizes


def test_capture_sizes_are_powers_to_8_then_steps_of_16_up_to_max_num_seqs():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]  # max_num_seqs itself: every batch has a graph
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]


def test_a_batch_runs_on_the_smallest_graph_that_holds_it():
    sizes = capture_sizes(64)
    assert [padded_batch_size(n, sizes) for n in (1, 3, 8, 9, 17, 33, 64)] == [1, 4, 8, 16, 32, 48, 64]
    with pytest.raises(ValueError, match="largest captured is 64"):
        padded_batch_size(65, sizes)


def test_graphs_are_captured_largest_first(tiny_gpt2_dir):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, max_num_seqs=40)
    with_graphs(llm)
    runner = llm.engine.model_runner.graph_runner
    assert runner.capture_order == [40, 32, 16, 8, 4, 2, 1]
    assert runner.block_tables.shape == (40, 128 // 4)  # full width: the blocks of max_model_len


# ---------------------------------------------------------------- the static buffers


def decode_plans(llm: LLM, prompts: list[str]) -> list:
    """Run `prompts` to completion; the plans of the decode steps, each with its buffers just after
    staging (inputs, block tables) and the slots of its real rows."""
    runner = llm.engine.model_runner.graph_runner
    seen = []
    stage = runner.stage

    def recording(plan):
        size = stage(plan)
        seen.append((plan, size, runner.inputs[:, :size].clone(), runner.block_tables.clone()))
        return size

    runner.stage = recording
    llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    return seen


@pytest.mark.parametrize("num_seqs, size", [(3, 4), (9, 16), (17, 32)])
def test_staging_puts_the_real_rows_in_front_and_neutral_padding_behind(tiny_gpt2_dir, num_seqs, size):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=128, max_num_seqs=32)
    with_graphs(llm)
    prompts = (PROMPTS * 2)[:num_seqs]
    staged = decode_plans(llm, prompts)
    assert staged and all(s == size for _, s, _, _ in staged)
    for plan, _, inputs, tables in staged:
        for row, s in enumerate(plan.scheduled):
            table, position = s.block_ids[0], s.num_computed_tokens
            assert inputs[:, row].tolist() == [s.seq.get_token_ids()[position], position,
                                               table[position // 4] * 4 + position % 4, position + 1]
            assert tables[row, :len(table)].tolist() == list(table)
        # padding: token 0, position 0, slot -1 (writes nothing), context 0 (reads nothing)
        assert inputs[:, num_seqs:].tolist() == [[0] * (size - num_seqs), [0] * (size - num_seqs),
                                                 [-1] * (size - num_seqs), [0] * (size - num_seqs)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_padded_rows_never_write_kv(tiny_gpt2_dir, backend):
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, max_num_seqs=8, attention_backend=backend)
    replays = with_graphs(llm)
    engine = llm.engine
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # the prefill
    before = engine.cache_engine._gpu_kv.clone()
    plan_slots = []
    schedule = engine.scheduler.schedule

    def recording():
        plan = schedule()
        plan_slots.extend(s.block_ids[0][s.num_computed_tokens // 4] * 4 + s.num_computed_tokens % 4
                          for s in plan.scheduled)
        return plan

    engine.scheduler.schedule = recording
    engine.step()  # a decode of 3 sequences on the graph for 4
    assert replays == [4] and len(plan_slots) == 3
    kv = engine.cache_engine._gpu_kv  # (num_layers, 2, num_kv_heads, num_blocks, block_size, head_dim)
    changed = (kv != before).any(dim=-1).any(dim=2).any(dim=1).any(dim=0).flatten()  # per slot
    assert changed.nonzero().flatten().tolist() == sorted(plan_slots)


@pytest.mark.parametrize("device", DEVICES)
def test_skipping_padding_writes_what_writing_the_real_rows_writes(device):
    cache = CacheEngine(1, 2, 8, 4, 16, 0, device, torch.float32)
    cache._gpu_kv.copy_(torch.randn(cache._gpu_kv.shape, generator=torch.Generator().manual_seed(0)))
    k_cache, v_cache = cache.gpu_cache[0]
    key, value = torch.randn(5, 2, 8, device=device), torch.randn(5, 2, 8, device=device)
    slots = torch.tensor([9, 3, 40, -1, -1], device=device)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_to_cache(key[:3], value[:3], expected_k, expected_v, slots[:3])
    write_to_cache_skipping_padding(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    before = cache._gpu_kv.clone()  # every row padding (a graph's capture): nothing changes
    write_to_cache_skipping_padding(key, value, k_cache, v_cache, torch.full((5,), -1, device=device))
    assert torch.equal(cache._gpu_kv, before)


# ---------------------------------------------------------------- a padded row's attention


def graph_metadata(context_lens: list[int], tables: list[list[int]], block_size: int, width: int, backend: str,
                   device: str):
    """What a graph's decode sees: full-width tables, the padding rows' context 0."""
    from engine.attention import DecodeGroup, decode_key_mask

    padded_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=device)
    lens = torch.tensor(context_lens, device=device)
    n = len(context_lens)
    rows = torch.arange(n + 1, device=device)
    return AttentionMetadata(
        slot_mapping=torch.full((n,), -1, device=device), positions=torch.zeros_like(rows[:n]),
        block_tables=padded_tables, context_lens_tensor=lens, query_start_loc=rows, query_starts=tuple(range(n + 1)),
        last_token_indices=rows[:n], query_lens=(1,) * n, context_lens=(width * block_size,) * n,
        block_size=block_size, prefill_seq_ids=(), decode_token_ids=rows[:n],
        decode_groups=(DecodeGroup(None, padded_tables, decode_key_mask(lens, width * block_size)),),
        decode_only=True, attention_backend=backend, padded=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_a_padding_rows_attention_is_finite_and_the_real_rows_are_unchanged(backend, device):
    """The triton kernel's padding row is 0 by its own guard; the torch path's by SDPA's rule for a
    fully masked row (0 rather than NaN since torch 2.5, pytorch#131060): this checks it on the
    SDPA backend the device picks."""
    block_size, width, heads, head_dim = 4, 6, 4, 16
    cache = CacheEngine(1, 2, head_dim, block_size, 32, 0, device, torch.float32)
    cache._gpu_kv.copy_(torch.randn(cache._gpu_kv.shape, generator=torch.Generator().manual_seed(1)))
    k_cache, v_cache = cache.gpu_cache[0]
    tables, lens = [[3, 7, 1], [5, 2]], [11, 6]
    query = torch.randn(4, heads, head_dim, device=device)
    key = value = torch.zeros(4, 2, head_dim, device=device)  # slot -1 everywhere: nothing is written
    meta = graph_metadata(lens + [0, 0], tables + [[], []], block_size, width, backend, device)
    out = paged_attention(query, key, value, k_cache, v_cache, meta, 0.25)
    assert torch.isfinite(out).all()
    assert torch.equal(out[2:], torch.zeros(2, heads, head_dim, device=device))  # context 0: 0, not 0 / 0
    ref_k, ref_v = (c.repeat_interleave(2, dim=2) for c in (k_cache, v_cache))  # one K/V head per query head
    ref_meta = AttentionMetadata.build(tables, [1, 1], lens, block_size, device)
    # the reference writes each row's newest K/V first: give it what its slot already holds
    last = ref_meta.slot_mapping
    ref = reference_paged_attention(query[:2], ref_k.flatten(0, 1)[last], ref_v.flatten(0, 1)[last],
                                    ref_k.clone(), ref_v.clone(), ref_meta, 0.25)
    torch.testing.assert_close(out[:2], ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the graph path against the eager one


def tiny_llama(tmp_path_factory):
    from test_llama_parity import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("llama-gqa"), "llama-gqa")


CASES = {  # name -> (model, number of prompts, engine options); the interpreted kernels get a small batch
    "gpt2-torch-v0-swap": ("gpt2", 9, dict(attention_backend="torch", num_gpu_blocks=40, num_cpu_blocks=64,
                                           preemption_mode="swap", watermark=0.0)),
    "gpt2-triton-v0": ("gpt2", 3, dict(attention_backend="triton", num_gpu_blocks=128, max_num_seqs=4)),
    "llama-torch-v1-prefix": ("llama", 9, dict(attention_backend="torch", num_gpu_blocks=96, kv_manager=V1.name,
                                               max_num_batched_tokens=32)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_graphs_give_the_eager_tokens_events_and_kv_digests(tiny_gpt2_dir, tmp_path_factory, case):
    model, num_prompts, options = CASES[case]
    if options["attention_backend"] == "triton" and not triton_available():
        pytest.skip("triton is not installed")
    path = str(tiny_gpt2_dir if model == "gpt2" else tiny_llama(tmp_path_factory))
    options = {"block_size": 4, "max_num_seqs": 16, "device": "cpu", **options}
    eager = LLM(path, enforce_eager=True, **options)
    assert eager.engine.model_runner.graph_runner is None
    graphed = LLM(path, **options)
    replays = with_graphs(graphed)
    prompts, max_tokens = PROMPTS[:num_prompts], 14 if num_prompts > 3 else 6
    eager_tokens, eager_events = run(eager, prompts, max_tokens)
    graph_tokens, graph_events = run(graphed, prompts, max_tokens)
    decodes = [e for e in graph_events if e["type"] == "step_started" and e["kind"] == "decode"]
    assert len(replays) == len(decodes) > 3
    assert max(replays) == padded_batch_size(num_prompts, capture_sizes(options["max_num_seqs"]))  # 9: 16
    assert graph_tokens == eager_tokens
    if torch.cuda.is_available():
        assert graph_events == eager_events  # every block event, step, token and K/V digest
    else:
        # The CPU stand-in runs the padded batch through the CPU's matmul, whose kernel (and so the
        # last bits of K/V) may depend on the batch size on some processors: every event but the
        # digests' bytes is equal, and the K/V tensors themselves are equal to within rounding.
        def without_digest(events):
            return [{k: v for k, v in e.items() if k != "digest"} for e in events]

        assert without_digest(graph_events) == without_digest(eager_events)
        torch.testing.assert_close(graphed.engine.cache_engine._gpu_kv, eager.engine.cache_engine._gpu_kv,
                                   rtol=1e-4, atol=1e-5)
    assert any(e["type"] == "kv_digest" for e in graph_events)
    if "swap" in case:
        assert any(e["type"] == "swap_out" for e in graph_events)


# ---------------------------------------------------------------- round trips


def test_a_decode_step_makes_one_copy_each_way(tiny_gpt2_dir, monkeypatch):
    """A graphed decode step: its inputs go to the device in one copy (`to_device`, no other
    tensor built from host data) and its sampled ids come back in one (`tolist`)."""
    import engine.attention
    import engine.cuda_graphs
    import engine.model_runner

    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, max_num_seqs=8)
    replays = with_graphs(llm)
    engine_ = llm.engine
    engine_.events.subscribe(lambda event: None)
    engine_.config.kv_digests = False  # digests read the cache back on purpose; the step's own traffic here
    for prompt in PROMPTS[:3]:
        engine_.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    engine_.step()  # the prefill, eager
    counts = {"to_device": 0, "torch.tensor": 0, "to host": 0}
    real_to_device, real_tensor = engine.attention.to_device, torch.tensor

    def counting_to_device(*args, **kwargs):
        counts["to_device"] += 1
        return real_to_device(*args, **kwargs)

    def counting_tensor(*args, **kwargs):
        counts["torch.tensor"] += 1
        return real_tensor(*args, **kwargs)

    for module in (engine.attention, engine.cuda_graphs, engine.model_runner):
        monkeypatch.setattr(module, "to_device", counting_to_device, raising=False)
    monkeypatch.setattr(torch, "tensor", counting_tensor)
    for name in ("tolist", "item", "cpu", "numpy"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, real=real, **k: (
            counts.__setitem__("to host", counts["to host"] + 1), real(self, *a, **k))[1])
    engine_.step()  # a decode, graphed
    assert replays == [4]
    assert counts == {"to_device": 1, "torch.tensor": 1, "to host": 1}
    counts.update(dict.fromkeys(counts, 0))
    engine_.model_runner.graph_runner = None
    engine_.step()  # the same decode, eager: the metadata, its length groups, the token ids
    assert counts["to host"] == 1 and counts["to_device"] == counts["torch.tensor"] <= 3


# ---------------------------------------------------------------- switches


def test_graphs_are_off_on_the_cpu_and_with_enforce_eager(tiny_gpt2_dir):
    assert LLM(str(tiny_gpt2_dir), num_gpu_blocks=16, device="cpu").engine.model_runner.graph_runner is None
    with pytest.raises(ValueError, match="enforce_eager"):
        LLM(str(tiny_gpt2_dir), enforce_eager="yes")


def test_a_capture_the_device_refuses_leaves_decode_eager_with_a_warning(tiny_gpt2_dir):
    """Graphs are on by default on CUDA: a device or driver whose capture fails must not stop the
    engine. The runner says why in one warning and decodes eagerly, giving the same tokens."""

    class Refusing:
        def capture(self, forward):
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    llm = LLM(str(tiny_gpt2_dir), num_gpu_blocks=64, device="cpu")
    expected, _ = run(llm)
    engine = llm.engine
    with pytest.warns(RuntimeWarning, match="could not be captured .operation not permitted when stream is "
                                            "capturing.: decode steps run eagerly; --enforce-eager"):
        runner = ModelRunner(engine.model, engine.cache_engine, engine.config.block_size, engine.device,
                             engine.config.attention_backend, max_num_seqs=engine.config.max_num_seqs,
                             capture=Refusing())
    assert runner.graph_runner is None and "more detail" not in runner.graphs_skipped
    engine.model_runner = runner
    assert run(llm)[0] == expected


def test_the_cli_takes_enforce_eager():
    from blockviz.cli import build_parser
    from blockviz.session.spec import EngineSpec

    for argv, expected in ((["generate", "--enforce-eager"], True), (["generate"], False)):
        args = build_parser().parse_args(argv)
        assert EngineSpec.from_args(args).config.enforce_eager is expected


# ---------------------------------------------------------------- on a GPU


@pytest.mark.cuda
@skip_without_cuda
@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_cuda_graphs_give_the_eager_tokens_and_cache(tiny_gpt2_dir, backend):
    """Real graphs against the eager path, float32. Tokens and every event but the digests' values
    equal; the caches equal within rounding: a batch of 9 runs as 16 rows under a graph, and a GEMM of
    16 rows may use another kernel than one of 9 (same math, another summation order)."""
    options = dict(block_size=4, num_gpu_blocks=128, max_num_seqs=16, device="cuda", dtype="float32",
                   attention_backend=backend)
    eager = LLM(str(tiny_gpt2_dir), enforce_eager=True, **options)
    graphed = LLM(str(tiny_gpt2_dir), **options)
    runner = graphed.engine.model_runner.graph_runner
    assert runner.capture_order == [16, 8, 4, 2, 1]
    eager_tokens, eager_events = run(eager)
    graph_tokens, graph_events = run(graphed)
    assert graph_tokens == eager_tokens
    strip = lambda events: [{k: v for k, v in e.items() if k != "digest"} for e in events]  # noqa: E731
    assert strip(graph_events) == strip(eager_events)
    torch.testing.assert_close(graphed.engine.cache_engine._gpu_kv, eager.engine.cache_engine._gpu_kv,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@skip_without_cuda
def test_cuda_graphs_share_one_pool_and_are_on_by_default(tiny_gpt2_dir):
    capture = CUDAGraphCapture()
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=64, max_num_seqs=4, device="cuda")
    assert llm.engine.model_runner.graph_runner is not None  # on by default on CUDA
    with_graphs(llm, capture)
    assert capture.pool is not None
    assert LLM(str(tiny_gpt2_dir), num_gpu_blocks=64, device="cuda",
               enforce_eager=True).engine.model_runner.graph_runner is None

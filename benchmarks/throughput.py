"""Benchmark: the paged engine against transformers' generate on one mixed workload, in one run
(a benchmark, not a test: it prints tokens/s and ratios, it never fails on time).

Workload: --requests requests (default 64) with prompt lengths --prompt-lens (16-256) and max_tokens
--max-tokens (16-128) drawn from a fixed seed, greedy, ignore_eos, on a GPT-2-small-shaped model (12
layers, 768 wide, 50,257 vocab, random weights built locally: nothing is downloaded) in float32 on
the CPU (or CUDA).

Contenders, each generating exactly the workload's tokens (useful tokens are counted; padding and
tokens past a request's max_tokens are not):
  engine           this project's LLM.generate (continuous batching, paged KV)
  engine+sub       the same with one no-op event subscriber attached
  hf padded        transformers generate on left-padded batches of --hf-batch-size requests, each
                   batch generating as many tokens as its longest request asks for
  hf one-by-one    transformers generate, one request at a time
  hf generate_batch  transformers' own continuous batching: the manager behind `generate_batch`,
                   each request added with its own max_new_tokens (generate_batch itself takes one
                   for all), its KV cache sized to the workload as the engine's is; where this
                   transformers has no generate_batch, the table says so

    python benchmarks/throughput.py [--requests 64] [--hf-batch-size 64] [--skip-one-by-one]
    python benchmarks/throughput.py --smoke    # every part on a tiny model, in seconds (tests/test_benchmarks.py)

The compute-bound limit (--engine-only runs the engine alone, --repeat times): the workload's
FLOPs (every GEMM the engine must do: each fed token through every layer's projections and MLP,
its attention over the keys it sees, the LM head once per sampled token) against this machine's
measured fp32 GEMM peak (the best of several large square matmuls); the fraction is FLOPs / (peak
x engine seconds). --profile breaks one engine run down by operator (torch.profiler) into GEMMs,
attention, gathers and copies, the sampler, and what is left (Python per token, events). The CPU
workload of benchmarks/README.md:

    python benchmarks/throughput.py --engine-only --repeat 5 --requests 48 --prompt-lens 16-128 \
        --max-tokens 8-64 --layers 6 --width 384 --heads 6 [--profile]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def build_model(path: Path, layers: int, width: int, heads: int) -> Path:
    from conftest import build_tokenizer  # the tests' local byte-level BPE: no network
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tokenizer()
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024, vocab_size=50257,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_workload(num_requests: int, prompt_lens: tuple[int, int] = (16, 256), max_tokens: tuple[int, int] = (16, 128),
                  seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(1000, 50000) for _ in range(rng.randint(*prompt_lens))], rng.randint(*max_tokens))
            for _ in range(num_requests)]


def make_llm(path: Path, workload, attention_backend: str | None = None):
    from engine import LLM

    backend = {"attention_backend": attention_backend} if attention_backend else {}  # older engines lack it
    return LLM(str(path), block_size=16, num_gpu_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload),
               num_cpu_blocks=0, max_num_seqs=len(workload), max_num_batched_tokens=4096, **backend)


def generate(llm, workload, cpu_times: list[float] | None = None) -> tuple[float, int]:
    """One timed LLM.generate over the workload: (seconds, useful tokens); the process's CPU
    seconds are appended to `cpu_times` when given."""
    from engine import SamplingParams

    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    if cpu_times is not None:
        cpu_times.append(time.process_time() - cpu_start)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert tokens == sum(m for _, m in workload)
    return elapsed, tokens


def run_engine(path: Path, workload, subscribe: bool, attention_backend: str | None = None) -> tuple[float, int]:
    llm = make_llm(path, workload, attention_backend)
    if subscribe:
        llm.events.subscribe(lambda event: None)
    generate(llm, workload[:2])  # warm-up
    return generate(llm, workload)


# ---------------------------------------------------------------- the compute-bound limit


def gemm_peak_gflops(size: int = 2048, repeats: int = 10) -> tuple[float, float]:
    """This machine's fp32 GEMM rate: the best of `repeats` (size x size) @ (size x size) matmuls,
    by wall seconds and by the process's CPU seconds (GFLOPS, GFLOPS)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = best_cpu = float("inf")
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        best, best_cpu = min(best, time.perf_counter() - start), min(best_cpu, time.process_time() - cpu_start)
    flops = 2 * size**3 / 1e9
    return flops / best, flops / best_cpu


def workload_flops(workload, layers: int, width: int, vocab: int = 50257) -> dict[str, float]:
    """The FLOPs the engine must do for the workload (multiply-adds x 2), by kind.

    Each fed token (the prompt, then every generated token but the last) goes through every
    layer's QKV, output, and MLP projections (12 x width^2 multiply-adds) and attends over the
    positions up to its own (2 x width per key: scores and the weighted sum); each sampled token
    needs one LM-head row (width x vocab).
    """
    fed = attended = sampled = 0
    for prompt, max_tokens in workload:
        total = len(prompt) + max_tokens - 1  # tokens that go through the model
        fed += total
        attended += total * (total + 1) // 2  # token at position i sees i + 1 keys
        sampled += max_tokens
    return {"projections + MLP": 2.0 * fed * layers * 12 * width**2,
            "attention": 2.0 * attended * layers * 2 * width,
            "LM head": 2.0 * sampled * width * vocab}


PROFILE_KINDS = {  # operator name fragments -> the step's parts (the first match wins)
    "GEMMs": ("aten::addmm", "aten::mm", "aten::linear", "aten::matmul", "aten::bmm"),
    "attention (SDPA)": ("scaled_dot_product", "_flash_attention", "_efficient_attention"),
    "gathers / cache writes": ("index_select", "index_copy", "index_put", "aten::index", "gather", "scatter"),
    "sampler (argmax)": ("aten::argmax", "aten::max", "aten::topk", "aten::sort", "multinomial", "softmax"),
    "element-wise (layer norm, GELU, adds)": ("layer_norm", "gelu", "aten::add", "aten::mul", "aten::div",
                                             "aten::embedding"),
    "tensor building and copies": ("aten::zeros", "aten::empty", "aten::tensor", "aten::copy_", "aten::to",
                                   "aten::lift", "aten::cat", "aten::stack", "aten::contiguous", "aten::clone",
                                   "aten::fill_", "aten::arange", "aten::tril", "aten::ones", "aten::lt",
                                   "aten::masked_fill", "aten::full"),
}


def profile_engine(path: Path, workload, attention_backend: str | None, top: int = 15) -> None:
    """One engine run under torch.profiler: where the time goes, by part and by operator."""
    from torch.profiler import ProfilerActivity, profile

    llm = make_llm(path, workload, attention_backend)
    generate(llm, workload[:2])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        elapsed, _ = generate(llm, workload)
    # profiler overhead inflates `elapsed`; shares are of the operators' own (self) time
    averages = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_ops = sum(e.self_cpu_time_total for e in averages) / 1e6
    by_kind: dict[str, float] = {}
    for event in averages:
        kind = next((k for k, names in PROFILE_KINDS.items() if any(n in event.key for n in names)), "other ops")
        by_kind[kind] = by_kind.get(kind, 0.0) + event.self_cpu_time_total / 1e6
    by_kind["Python and the rest (no torch op)"] = max(elapsed - total_ops, 0.0)
    print(f"profile: {elapsed:.2f} s under the profiler, {total_ops:.2f} s in torch operators")
    for kind, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:44} {seconds:7.2f} s {100 * seconds / elapsed:5.1f}%")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def run_engine_only(args, path: Path, workload) -> dict[str, float]:
    """The engine alone, --repeat times, against the compute-bound limit. With one torch thread
    the process's CPU seconds are a steadier figure than wall seconds on a shared machine (time
    spent descheduled is not counted): both are printed. Returns the figures."""
    import engine

    flops = workload_flops(workload, args.layers, args.width)
    total = sum(flops.values())
    peak, cpu_peak = gemm_peak_gflops(args.gemm_size, args.gemm_repeats)
    print(f"engine from {Path(engine.__file__).parent}; torch threads {torch.get_num_threads()}")
    print(f"fp32 GEMM peak ({args.gemm_size}^3 matmul, best of {args.gemm_repeats}): {peak:.1f} GFLOPS, "
          f"{cpu_peak:.1f} per CPU second")
    print("workload FLOPs: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in flops.items())
          + f" = {total / 1e9:.1f} GFLOP; at the peak {total / peak / 1e9:.2f} s")
    llm = make_llm(path, workload, args.attention_backend)
    generate(llm, workload[:2])  # warm-up
    times: list[float] = []
    cpu_times: list[float] = []
    for i in range(args.repeat):
        seconds, tokens = generate(llm, workload, cpu_times)
        times.append(seconds)
        print(f"run {i + 1}: {seconds:.2f} s ({cpu_times[-1]:.2f} s CPU), {tokens / seconds:.0f} tokens/s, "
              f"{total / seconds / 1e9:.1f} GFLOPS = {total / seconds / 1e9 / peak:.1%} of the peak")
    median = sorted(times)[len(times) // 2]
    cpu_median = sorted(cpu_times)[len(cpu_times) // 2]
    print(f"engine: median {median:.2f} s (best {min(times):.2f}, worst {max(times):.2f}), CPU median "
          f"{cpu_median:.2f} s; {total / median / 1e9 / peak:.1%} of the compute-bound limit at the median "
          f"({total / min(times) / 1e9 / peak:.1%} best; by CPU seconds {total / cpu_median / 1e9 / cpu_peak:.1%})")
    if args.profile:
        profile_engine(path, workload, args.attention_backend)
    return {"engine-only tokens/s": tokens / median, "engine-only CPU s": cpu_median,
            "fraction of the limit": total / median / 1e9 / peak,
            "fraction of the limit by CPU s": total / cpu_median / 1e9 / cpu_peak}


# ---------------------------------------------------------------- transformers, side by side


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> None:
    """transformers' `generate` on a left-padded batch, greedy, exactly `new_tokens` tokens per
    row (min = max: the random model's EOS does not stop a row early, as ignore_eos does not)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, pad_token_id=0)


def run_hf_padded(model, workload, batch_size: int) -> tuple[float, int]:
    """Static batching: each batch of `batch_size` requests generates as many tokens as its longest
    request asks for; only each request's own max_tokens count."""
    hf_generate(model, [p for p, _ in workload[:2]], 2)  # warm-up
    start = time.perf_counter()
    for i in range(0, len(workload), batch_size):
        batch = workload[i:i + batch_size]
        hf_generate(model, [p for p, _ in batch], max(m for _, m in batch))
    return time.perf_counter() - start, sum(m for _, m in workload)


def run_hf_one_by_one(model, workload) -> tuple[float, int]:
    """No batching: each request alone through `generate`."""
    hf_generate(model, [workload[0][0]], 2)  # warm-up
    start = time.perf_counter()
    for prompt, max_tokens in workload:
        hf_generate(model, [prompt], max_tokens)
    return time.perf_counter() - start, sum(m for _, m in workload)


def run_hf_generate_batch(model, workload) -> tuple[float, int] | str:
    """transformers' continuous batching: the manager `generate_batch` runs (its
    `continuous_batching_context_manager`), each request added with its own max_new_tokens. Its
    KV cache is sized to the workload, 16-token blocks, as the engine's is: left to itself it sizes
    the cache from the machine's free memory, which on the CPU costs tens of seconds before the
    first token. Returns (seconds, useful tokens), or why it did not run."""
    import transformers

    if not hasattr(model, "generate_batch"):
        return f"absent: transformers {transformers.__version__} has no generate_batch"
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    cache = ContinuousBatchingConfig(block_size=16, num_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload),
                                     max_batch_tokens=4096, use_cuda_graph=False)
    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                              max_new_tokens=max(m for _, m in workload))

    def timed(requests) -> tuple[float, int]:
        with model.continuous_batching_context_manager(generation_config=config, continuous_batching_config=cache,
                                                       block=True, timeout=5, warmup=False) as manager:
            start = time.perf_counter()
            ids = [manager.add_request(prompt, max_new_tokens=m) for prompt, m in requests]
            done = {}
            while len(done) < len(ids):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError(f"its generation thread stopped after {len(done)} of {len(ids)} requests")
                elif result.is_finished():
                    if result.error is not None:
                        raise RuntimeError(f"request {result.request_id}: {result.error}")
                    done[result.request_id] = len(result.generated_tokens)
            elapsed = time.perf_counter() - start
        produced = [done[i] for i in ids]
        if produced != [m for _, m in requests]:
            raise RuntimeError(f"generated {produced} tokens where {[m for _, m in requests]} were asked for")
        return elapsed, sum(produced)

    try:
        timed(workload[:2])  # warm-up
        return timed(workload)
    except Exception as exc:  # report, don't hide: say what failed on this version
        return f"did not run on transformers {transformers.__version__}: {type(exc).__name__}: {str(exc)[:160]}"


def compare(args, path: Path, workload) -> dict[str, float]:
    """The engine against transformers, side by side: prints the table, returns the figures."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(path).eval()
    padded = f"hf generate, padded batches of {args.hf_batch_size}"
    results: dict[str, tuple[float, int] | str] = {
        "engine": run_engine(path, workload, subscribe=False, attention_backend=args.attention_backend),
        "engine + no-op subscriber": run_engine(path, workload, subscribe=True, attention_backend=args.attention_backend),
        padded: run_hf_padded(hf, workload, args.hf_batch_size),
        "hf generate_batch (continuous batching)": ("skipped (--skip-generate-batch)" if args.skip_generate_batch
                                                    else run_hf_generate_batch(hf, workload)),
        "hf generate, one request at a time": ("skipped (--skip-one-by-one)" if args.skip_one_by_one
                                               else run_hf_one_by_one(hf, workload)),
    }
    engine_tps = results["engine"][1] / results["engine"][0]
    print(f"{'contender':44} {'seconds':>9} {'tokens/s':>10} {'engine / it':>12}")
    figures = {}
    for name, result in results.items():
        if isinstance(result, str):
            print(f"{name:44} {result}")
            continue
        seconds, tokens = result
        tps = tokens / seconds
        figures[f"{name} tokens/s"] = tps
        print(f"{name:44} {seconds:9.2f} {tps:10.1f} {engine_tps / tps:11.2f}x")
    sub = results["engine + no-op subscriber"]
    figures["subscriber / bare"] = sub[1] / sub[0] / engine_tps
    figures["engine / hf padded"] = engine_tps / figures[f"{padded} tokens/s"]
    print(f"event stream cost: engine with a subscriber runs at {figures['subscriber / bare']:.3f}x "
          f"the bare engine's tokens/s (target >= 0.95)")
    print(f"engine vs padded batched generate: {figures['engine / hf padded']:.2f}x (target >= 1.5)")
    return figures


def span(text: str) -> tuple[int, int]:
    """'LO-HI' -> (LO, HI)."""
    low, _, high = text.partition("-")
    return int(low), int(high or low)


SMOKE = dict(requests=4, hf_batch_size=2, layers=2, width=64, heads=2, prompt_lens=(8, 24), max_tokens=(3, 6),
             repeat=1, gemm_size=256, gemm_repeats=2, profile=True, threads=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--skip-one-by-one", action="store_true")
    parser.add_argument("--skip-generate-batch", action="store_true")
    parser.add_argument("--prompt-lens", type=span, default=(16, 256), metavar="LO-HI")
    parser.add_argument("--max-tokens", type=span, default=(16, 128), metavar="LO-HI")
    parser.add_argument("--attention-backend", choices=("torch", "triton"), default=None)
    parser.add_argument("--engine-only", action="store_true",
                        help="the engine alone, --repeat runs, against this CPU's GEMM peak")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gemm-size", type=int, default=2048, help="--engine-only: the peak's square matmul size")
    parser.add_argument("--gemm-repeats", type=int, default=10, help="--engine-only: the peak is the best of these")
    parser.add_argument("--profile", action="store_true", help="with --engine-only: a torch.profiler breakdown")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true",
                        help="every part (the comparison, then --engine-only --profile) on a tiny model: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    workload = make_workload(args.requests, args.prompt_lens, args.max_tokens)
    print(f"workload: {len(workload)} requests, prompts {min(len(p) for p, _ in workload)}-"
          f"{max(len(p) for p, _ in workload)} tokens, max_tokens {min(m for _, m in workload)}-"
          f"{max(m for _, m in workload)}, {sum(m for _, m in workload):,} tokens to generate; "
          f"GPT-2 {args.layers} layers x {args.width}, float32, torch threads {torch.get_num_threads()}")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp), args.layers, args.width, args.heads)
        if args.smoke or not args.engine_only:
            figures.update(compare(args, path, workload))
        if args.smoke or args.engine_only:
            figures.update(run_engine_only(args, path, workload))
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

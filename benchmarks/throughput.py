"""Benchmark: the paged engine against transformers' generate on one mixed workload, in one run
(a benchmark, not a test: it prints tokens/s and ratios, it never fails on time).

Workload: --requests requests (default 64) with prompt lengths 16-256 and max_tokens 16-128 drawn
from a fixed seed, greedy, ignore_eos, on a GPT-2-small-shaped model (12 layers, 768 wide, 50,257
vocab, random weights built locally: nothing is downloaded) in float32 on the CPU (or CUDA).

Contenders, each generating exactly the workload's tokens (useful tokens are counted; padding and
tokens past a request's max_tokens are not):
  engine           this project's LLM.generate (continuous batching, paged KV)
  engine+sub       the same with one no-op event subscriber attached
  hf padded        transformers generate on left-padded batches of --hf-batch-size requests
  hf one-by-one    transformers generate, one request at a time
  hf generate_batch  transformers' own continuous batching, where it runs for GPT-2

    python benchmarks/throughput.py [--requests 64] [--hf-batch-size 64] [--skip-one-by-one]
"""

from __future__ import annotations

import argparse
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


def make_workload(num_requests: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(1000, 50000) for _ in range(rng.randint(16, 256))], rng.randint(16, 128))
            for _ in range(num_requests)]


def run_engine(path: Path, workload, subscribe: bool) -> tuple[float, int]:
    from engine import LLM, SamplingParams

    llm = LLM(str(path), block_size=16, num_gpu_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload),
              num_cpu_blocks=0, max_num_seqs=len(workload), max_num_batched_tokens=4096)
    if subscribe:
        llm.events.subscribe(lambda event: None)
    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    llm.generate(prompts[:2], params[:2])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert tokens == sum(m for _, m in workload)
    return elapsed, tokens


def run_hf_padded(model, workload, batch_size: int) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(workload), batch_size):
        batch = workload[i : i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        new = max(m for _, m in batch)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=0)
        tokens += sum(m for _, m in batch)
    return time.perf_counter() - start, tokens


def run_hf_one_by_one(model, workload) -> tuple[float, int]:
    start = time.perf_counter()
    for prompt, max_tokens in workload:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                           min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    return time.perf_counter() - start, sum(m for _, m in workload)


def run_hf_generate_batch(model, workload) -> tuple[float, int]:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max(m for _, m in workload), do_sample=False, eos_token_id=-1,
                              pad_token_id=0)
    start = time.perf_counter()
    results = model.generate_batch(inputs=[p for p, _ in workload], generation_config=config)
    elapsed = time.perf_counter() - start
    # generate_batch takes one max_new_tokens for all: count only each request's useful tokens, and
    # only tokens it really produced (a failed request produces none).
    produced = [len(getattr(out, "generated_tokens", []) or []) for out in results.values()]
    if len(produced) != len(workload) or min(produced) == 0:
        raise RuntimeError(f"{sum(p == 0 for p in produced)} of {len(workload)} requests produced no tokens")
    return elapsed, sum(min(p, m) for p, (_, m) in zip(produced, workload))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--skip-one-by-one", action="store_true")
    parser.add_argument("--skip-generate-batch", action="store_true")
    args = parser.parse_args()
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    workload = make_workload(args.requests)
    print(f"workload: {len(workload)} requests, prompts {min(len(p) for p, _ in workload)}-"
          f"{max(len(p) for p, _ in workload)} tokens, max_tokens {min(m for _, m in workload)}-"
          f"{max(m for _, m in workload)}, {sum(m for _, m in workload):,} tokens to generate; "
          f"GPT-2 {args.layers} layers x {args.width}, float32, torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp), args.layers, args.width, args.heads)
        hf = GPT2LMHeadModel.from_pretrained(path).eval()
        results: dict[str, tuple[float, int] | str] = {}
        results["engine"] = run_engine(path, workload, subscribe=False)
        results["engine + no-op subscriber"] = run_engine(path, workload, subscribe=True)
        results[f"hf generate, padded batches of {args.hf_batch_size}"] = run_hf_padded(hf, workload, args.hf_batch_size)
        if not args.skip_generate_batch:
            try:
                results["hf generate_batch (continuous batching)"] = run_hf_generate_batch(hf, workload)
            except Exception as exc:  # report, don't hide: it may not support GPT-2 on this version
                results["hf generate_batch (continuous batching)"] = f"did not run: {type(exc).__name__}: {str(exc)[:120]}"
        if not args.skip_one_by_one:
            results["hf generate, one request at a time"] = run_hf_one_by_one(hf, workload)
    engine_tps = results["engine"][1] / results["engine"][0]
    print(f"{'contender':44} {'seconds':>9} {'tokens/s':>10} {'engine / it':>12}")
    for name, result in results.items():
        if isinstance(result, str):
            print(f"{name:44} {result}")
            continue
        seconds, tokens = result
        tps = tokens / seconds
        print(f"{name:44} {seconds:9.1f} {tps:10.1f} {engine_tps / tps:11.2f}x")
    sub = results["engine + no-op subscriber"]
    print(f"event stream cost: engine with a subscriber runs at {sub[1] / sub[0] / engine_tps:.3f}x "
          f"the bare engine's tokens/s (target >= 0.95)")
    padded = results[f"hf generate, padded batches of {args.hf_batch_size}"]
    print(f"engine vs padded batched generate: {engine_tps / (padded[1] / padded[0]):.2f}x (target >= 1.5)")


if __name__ == "__main__":
    main()

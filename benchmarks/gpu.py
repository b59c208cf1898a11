"""Benchmark: the engine on the card it finds, side by side with transformers, in one run (figures,
not pass/fail).

Two model shapes with random weights built locally (save_pretrained into a temporary folder,
nothing downloaded): GPT-2 small (12 layers x 768, 50,257 vocab) in float16 and SmolLM2-135M (a
Llama: 30 layers x 576, grouped-query attention 9 / 3 heads, 49,152 vocab, tied embeddings) in
bfloat16. Workload: --requests requests (128) with prompts of --prompt-lens tokens (32-512) and
--max-tokens new tokens (32-256), drawn from a fixed seed, greedy, ignore_eos.

Contenders, each generating exactly the workload's tokens (only those count):
  engine <backend> graphs / eager   LLM.generate with CUDA graphs for decode steps (the default on
                                    CUDA) and with enforce_eager; triton and torch attention
  hf generate (padded)              transformers' generate on one left-padded batch of every request
  hf generate_batch                 transformers' continuous batching (benchmarks/throughput.py's
                                    run, each request with its own max_new_tokens), called outside
                                    torch.inference_mode

Per engine run: tokens/s; milliseconds per decode step (each engine.step() timed, the steps whose
sequences each computed one token); the GPU's busy share of the wall time (torch.profiler: device
time of the kernels and copies / wall, over --profile-requests requests); and the distance from the
memory-bandwidth limit: a decode step must read every weight once and each sequence's K/V once,
so (weight bytes + K/V bytes of the step) / the card's bandwidth is the least it can take; the
figure is the measured step over that, averaged over the decode steps. The bandwidth comes from a
table of cards by name (spec sheets) or --bandwidth-gbs.

    python benchmarks/gpu.py                 # on a CUDA machine
    python benchmarks/gpu.py --smoke         # tiny shapes; on the CPU graphs through the stand-in capture
                                             # (EagerCapture) and torch attention only
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from throughput import make_workload, run_hf_generate_batch, span  # noqa: E402

# Memory bandwidth by card, GB/s, from the vendors' spec sheets; the first name found in the
# device's name wins (more specific names first).
CARD_BANDWIDTH_GBS = {
    "GH200": 4000, "H200": 4800, "H100 NVL": 3900, "H100 PCIe": 2000, "H100": 3350, "B200": 8000,
    "A100-SXM4-80GB": 2039, "A100 80GB PCIe": 1935, "A100": 1555, "A10G": 600, "A10": 600, "L40S": 864,
    "L40": 864, "L4": 300, "RTX 4090": 1008, "RTX 3090": 936, "V100": 900, "T4": 320,
}
SHAPES = {  # name -> (transformers config class, config, dtype on CUDA)
    "gpt2-small": ("GPT2Config", dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
                   "float16"),
    "smollm2-135m": ("LlamaConfig", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                         max_position_embeddings=2048, rope_theta=100000.0,
                                         tie_word_embeddings=True, rms_norm_eps=1e-5), "bfloat16"),
}
SMOKE_SHAPES = {
    "gpt2-small": dict(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=320),
    "smollm2-135m": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=320, max_position_embeddings=128),
}
SMOKE = dict(requests=4, prompt_lens=(8, 24), max_tokens=(3, 6), profile_requests=2)


def card_bandwidth_gbs(name: str) -> float | None:
    """The table's bandwidth of the card called `name`, or None."""
    return next((gbs for card, gbs in CARD_BANDWIDTH_GBS.items() if card in name), None)


def build_checkpoint(folder: Path, shape: str, smoke: bool) -> Path:
    """Random weights of `shape` and the tests' local tokenizer, save_pretrained into `folder`."""
    import transformers
    from conftest import build_tokenizer

    kind, config, _ = SHAPES[shape]
    config = {**config, **SMOKE_SHAPES[shape]} if smoke else config
    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        getattr(transformers, kind)(**config, bos_token_id=eos, eos_token_id=eos))
    path = folder / shape
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------- the engine


def make_engine(loaded, workload, backend: str, graphs: bool, device: str):
    """An LLM over the loaded model, its pool sized to the workload. With graphs on the CPU the
    decode graphs are the stand-in's (EagerCapture: the same padded path, run eagerly)."""
    from engine import LLM
    from engine.config import EngineConfig
    from engine.cuda_graphs import EagerCapture
    from engine.llm_engine import LLMEngine
    from engine.model_runner import ModelRunner

    config = EngineConfig(model=str(loaded.path), device=device, dtype=str(loaded.dtype).removeprefix("torch."),
                          attention_backend=backend, enforce_eager=not graphs, block_size=16,
                          num_gpu_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload), num_cpu_blocks=0,
                          max_num_seqs=len(workload), max_num_batched_tokens=8192, kv_digests=False)
    engine = LLMEngine(config, loaded=loaded)
    if graphs and device != "cuda":
        engine.model_runner = ModelRunner(engine.model, engine.cache_engine, 16, engine.device, backend,
                                          max_num_seqs=config.max_num_seqs, capture=EagerCapture())
    return LLM.from_engine(engine)


def timed_steps(llm, workload, device: str) -> dict:
    """Run the workload step by step, timing each step; the decode steps' times and K/V read."""
    from engine import SamplingParams

    engine = llm.engine
    cache = engine.cache_engine
    kv_bytes_per_token = (cache.num_layers * 2 * cache.num_kv_heads * cache.head_dim
                          * torch.empty((), dtype=cache.dtype).element_size())
    execute = engine.model_runner.execute_model
    plans = []

    def recording(plan):
        plans.append(plan)
        return execute(plan)

    engine.model_runner.execute_model = recording
    for prompt, max_tokens in workload:
        engine.add_request({"prompt_token_ids": prompt}, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    decode_s, decode_kv, total = [], [], 0.0
    sync(device)
    while engine.has_unfinished_requests():
        plans.clear()
        start = time.perf_counter()
        engine.step()  # ends by reading the sampled ids back: the GPU is done
        elapsed = time.perf_counter() - start
        total += elapsed
        if plans and all(s.num_new_tokens == 1 for s in plans[0].scheduled):
            decode_s.append(elapsed)
            decode_kv.append(sum(s.num_tokens for s in plans[0].scheduled) * kv_bytes_per_token)
    engine.model_runner.execute_model = execute
    return {"seconds": total, "decode_s": decode_s, "decode_kv_bytes": decode_kv}


def gpu_busy_share(llm, workload, device: str) -> float:
    """Device time of the kernels and copies over the wall time of one generate (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from engine import SamplingParams

    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sync(device)
        start = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p, _ in workload], params)
        sync(device)
        wall = time.perf_counter() - start
    device_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return device_us / 1e6 / wall


# ---------------------------------------------------------------- transformers


def hf_padded(model, workload, device: str) -> float:
    """transformers' generate over one left-padded batch of every request, as many new tokens as
    the longest asks for; seconds."""
    width = max(len(p) for p, _ in workload)
    ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in workload], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in workload], device=device)
    new = max(m for _, m in workload)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
    sync(device)
    return time.perf_counter() - start


def hf_generate_batch(model, workload, device: str) -> tuple[float, int] | str:
    """transformers' continuous batching, outside torch.inference_mode (which breaks it): throughput.py's
    run, each request with its own max_new_tokens, where this transformers has ContinuousBatchingConfig;
    else `generate_batch` itself, every request run to the longest max_tokens and only each request's
    own tokens counted. (seconds, useful tokens), or why it did not run."""
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: F401
    except ImportError:
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=max(m for _, m in workload), do_sample=False, eos_token_id=-1,
                                  pad_token_id=0, block_size=16, max_batch_tokens=8192,
                                  num_blocks=sum((len(p) + max(m for _, m in workload)) // 16 + 2 for p, _ in workload))
        try:
            model.generate_batch(inputs=[p for p, _ in workload[:2]], generation_config=config)  # warm-up
            sync(device)
            start = time.perf_counter()
            model.generate_batch(inputs=[p for p, _ in workload], generation_config=config)
            sync(device)
            return time.perf_counter() - start, sum(m for _, m in workload)
        except Exception as exc:  # report, don't hide
            return f"did not run: {type(exc).__name__}: {str(exc)[:160]}"
    return run_hf_generate_batch(model, workload)


# ---------------------------------------------------------------- one shape


def bench_shape(args, shape: str, folder: Path, device: str, figures: dict) -> None:
    from transformers import AutoModelForCausalLM

    from engine.model_loader import load_model

    dtype = "float32" if device != "cuda" else SHAPES[shape][2]
    path = build_checkpoint(folder, shape, args.smoke)
    vocab = {**SHAPES[shape][1], **(SMOKE_SHAPES[shape] if args.smoke else {})}["vocab_size"]
    workload = [([t % vocab for t in prompt], m)
                for prompt, m in make_workload(args.requests, args.prompt_lens, args.max_tokens)]
    useful = sum(m for _, m in workload)
    loaded = load_model(str(path), device, getattr(torch, dtype))
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    bandwidth = args.bandwidth_gbs
    print(f"\n{shape} shape, {dtype}, {args.device_name}: {len(workload)} requests, prompts "
          f"{args.prompt_lens[0]}-{args.prompt_lens[1]}, {args.max_tokens[0]}-{args.max_tokens[1]} new tokens, "
          f"{useful:,} tokens to generate; weights {weight_bytes / 1e6:.1f} MB")
    print(f"{'contender':28} {'tokens/s':>10} {'ms/decode step':>15} {'decode steps':>13} {'GPU busy':>9} "
          f"{'x the bandwidth limit':>22}")
    backends = ["triton", "torch"] if args.triton else ["torch"]
    for backend in backends:
        for graphs in (True, False):
            name = f"engine {backend} {'graphs' if graphs else 'eager'}"
            llm = make_engine(loaded, workload, backend, graphs, device)
            timed_steps(llm, workload[:2], device)  # warm-up
            run = timed_steps(llm, workload, device)
            steps = run["decode_s"]
            ms = 1e3 * sum(steps) / max(len(steps), 1)
            figures[f"{shape} {name} tokens/s"] = useful / run["seconds"]
            figures[f"{shape} {name} ms/decode step"] = ms
            busy = limit = "n/a"
            if device == "cuda":
                share = gpu_busy_share(llm, workload[:args.profile_requests], device)
                figures[f"{shape} {name} GPU busy share"] = share
                busy = f"{share:.0%}"
            if bandwidth and steps:
                floors = [(weight_bytes + kv) / (bandwidth * 1e9) for kv in run["decode_kv_bytes"]]
                times_limit = sum(t / f for t, f in zip(steps, floors)) / len(steps)
                figures[f"{shape} {name} x the bandwidth limit"] = times_limit
                limit = f"{times_limit:.1f}x of {1e3 * sum(floors) / len(floors):.3f} ms"
            print(f"{name:28} {useful / run['seconds']:10.0f} {ms:15.2f} {len(steps):13d} {busy:>9} {limit:>22}")
            del llm
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    del loaded
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()
    hf.generation_config.eos_token_id = None
    hf_padded(hf, workload[:2], device)  # warm-up
    seconds = hf_padded(hf, workload, device)
    figures[f"{shape} hf generate (padded) tokens/s"] = useful / seconds
    print(f"{'hf generate (padded)':28} {useful / seconds:10.0f}")
    batch = hf_generate_batch(hf, workload, device)
    if isinstance(batch, str):
        print(f"{'hf generate_batch':28} {batch}")
    else:
        figures[f"{shape} hf generate_batch tokens/s"] = batch[1] / batch[0]
        print(f"{'hf generate_batch':28} {batch[1] / batch[0]:10.0f}")
    best = max(figures[f"{shape} engine {b} {m} tokens/s"] for b in backends for m in ("graphs", "eager"))
    for other in ("hf generate (padded)", "hf generate_batch"):
        if f"{shape} {other} tokens/s" in figures:
            figures[f"{shape} best engine / {other}"] = best / figures[f"{shape} {other} tokens/s"]
            print(f"best engine / {other}: {figures[f'{shape} best engine / {other}']:.2f}x")
    del hf
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--prompt-lens", type=span, default=(32, 512), metavar="LO-HI")
    parser.add_argument("--max-tokens", type=span, default=(32, 256), metavar="LO-HI")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--profile-requests", type=int, default=64,
                        help="requests in the profiled run that measures the GPU's busy share")
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="the card's memory bandwidth, GB/s (default: from the table of known cards)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, a few requests: a check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    from transformers.utils import logging as hf_logging

    from engine.kernels import triton_available

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.triton = triton_available() and device == "cuda"
    args.device_name = torch.cuda.get_device_name() if device == "cuda" else "the CPU"
    if device == "cuda" and args.bandwidth_gbs is None:
        args.bandwidth_gbs = card_bandwidth_gbs(args.device_name)
    print(f"device: {args.device_name}; torch {torch.__version__}; bandwidth "
          f"{f'{args.bandwidth_gbs:g} GB/s' if args.bandwidth_gbs else 'unknown'}")
    if device != "cuda":
        print("unavailable: no CUDA device: graphs run through the stand-in capture (eagerly), and the GPU's busy "
              "share is not measured")
    if not args.bandwidth_gbs:
        print("unavailable: the bandwidth limit needs the card's bandwidth: a card in the table, or --bandwidth-gbs")
    if not args.triton:
        print("unavailable: triton attention: " + ("not installed" if device == "cuda" else
              "on the CPU it runs only in Triton's interpreter, a correctness tool (tests/test_kernels.py)"))
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            bench_shape(args, shape, Path(tmp), device, figures)
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

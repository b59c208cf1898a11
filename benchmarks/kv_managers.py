"""Benchmark: engine tokens/s with vLLM v0's block manager, with vLLM v1's KV cache manager and with
vLLM 0.33's own Scheduler and KVCacheManager (`kv_manager="v0"` / `"v1"` / `"vllm"`), and the scheduler's
own time per step in each, on the throughput benchmark's workload and model (benchmarks/throughput.py:
mixed prompt lengths and max_tokens from a fixed seed, greedy, a GPT-2-small-shaped model with
random weights built locally). A benchmark, not a test: it prints figures, it never fails on time.

The scheduler's time per step is the wall time inside the calls the engine makes to its scheduler
(`schedule`, `update_from_output` with the token appends behind it; under `"vllm"` that is the adapter of
engine/vllm_core/ with vLLM inside it), divided by the steps; under `"vllm"` the time inside vLLM's own
`Scheduler.schedule` and `Scheduler.update_from_output` is given apart. The time inside the output
processor's token appends (`OutputProcessor.append_token`: append, stop check, detokenize, the
token's events, a stopped sequence's frees) is given apart too, and the scheduler's time without it:
the calls the engine made to its scheduler before the step had one `update_from_output`, when the
engine appended the tokens itself. Without vLLM installed the `"vllm"` mode is left out (an
`unavailable:` line).

After one untimed run of the whole workload (torch's first calls at new shapes are slow), the modes
take turns, v0 v1 vllm, then vllm v1 v0, ..., on one loaded model, so a machine that speeds up or
slows down mid-run weighs on all alike; the summary gives each mode's median and the median of the
per-round ratios. Every mode generates the same tokens (checked).

    python benchmarks/kv_managers.py [--requests 32] [--pairs 3] [--layers 12 --width 768 --heads 12]
    python benchmarks/kv_managers.py --smoke    # a tiny model, short requests, one round: a check that it runs
    python benchmarks/kv_managers.py --requests 16 --pairs 3 --stand-in-model --cpu-clock   # the scheduler alone

`--stand-in-model` replaces the model runner's forward and sampler with a stand-in (zero logits, and
a token that depends only on the sequence's id and length), so a step is the engine's own work and
the scheduler's share of it is measured over many short runs; every mode still generates the same
tokens. `--cpu-clock` times the scheduler's calls in this thread's CPU time (`time.thread_time`)
rather than wall time: a shared machine's other processes then weigh less on the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.designs import VLLM, get_design  # noqa: E402 (the registry imports without torch)
from throughput import build_model, make_workload  # noqa: E402


class SchedulerClock:
    """Wall time inside one engine's scheduler calls (`schedule`, `update_from_output`, wrapped on
    the instance; the update includes appending and stop-checking the sampled tokens), the steps
    (calls to `schedule`), the time inside those appends (`OutputProcessor.append_token`), and under
    kv_manager="vllm" the time inside vLLM's own `Scheduler.schedule` / `update_from_output`."""

    def __init__(self, engine, clock=time.perf_counter) -> None:
        self.clock = clock
        self.seconds = self.vllm_seconds = self.append_seconds = 0.0
        self.steps = 0
        scheduler = engine.scheduler
        for name in ("schedule", "update_from_output"):
            setattr(scheduler, name, self._timed(getattr(scheduler, name), "seconds", name == "schedule"))
        processor = engine.output_processor
        processor.append_token = self._timed(processor.append_token, "append_seconds", False)
        inner = getattr(scheduler, "vllm", None)  # engine/vllm_core's VllmScheduler wraps vLLM's Scheduler
        if inner is not None:
            for name in ("schedule", "update_from_output"):
                setattr(inner, name, self._timed(getattr(inner, name), "vllm_seconds", False))

    def _timed(self, call, total: str, counts_step: bool):
        clock = self.clock

        def timed(*args, **kwargs):
            start = clock()
            try:
                return call(*args, **kwargs)
            finally:
                setattr(self, total, getattr(self, total) + clock() - start)
                self.steps += counts_step

        return timed


def stand_in_model(engine) -> None:
    """The engine's forward and sampler replaced on its model runner: zero logits, and for each
    sequence a token from its id and length alone (the same in every mode)."""
    import torch

    runner = engine.model_runner
    runner.execute_model = lambda plan: torch.zeros((len(plan.scheduled), 1))
    runner.sample = lambda logits, seqs, params: [1000 + (seq.seq_id * 7 + seq.get_len()) % 5000 for seq in seqs]


def run(loaded, path: Path, workload, kv_manager: str, stand_in: bool = False,
        clock=time.perf_counter) -> tuple[float, list[list[int]], SchedulerClock]:
    from engine import EngineConfig, LLM, LLMEngine, SamplingParams

    config = EngineConfig(model=str(path), block_size=16, kv_manager=kv_manager, num_cpu_blocks=0,
                          num_gpu_blocks=sum((len(p) + m) // 16 + 2 for p, m in workload) + 1,
                          max_num_seqs=len(workload), max_num_batched_tokens=4096)
    engine = LLMEngine(config, loaded=loaded)
    if stand_in:
        stand_in_model(engine)
    llm = LLM.from_engine(engine)
    prompts = [{"prompt_token_ids": p} for p, _ in workload]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in workload]
    llm.generate(prompts[:2], params[:2])  # warm-up
    clock = SchedulerClock(engine, clock)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outputs], clock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=3, help="rounds: each mode runs once a round")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="4 short requests, a 2-layer 64-wide model, one round")
    parser.add_argument("--stand-in-model", action="store_true",
                        help="a stand-in forward and sampler (zero logits, a token from the sequence's id and length)")
    parser.add_argument("--cpu-clock", action="store_true", help="time the scheduler in this thread's CPU time")
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
    modes = ["v0", "v1"]
    if importlib.util.find_spec("vllm") is None:
        print("unavailable: vllm (vLLM is not installed: pip install -e '.[vllm]', see docs/vllm-core.md)")
    else:
        modes.append(VLLM.name)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "model", args.layers, args.width, args.heads)
        loaded = load_model(str(path), None, None)
        options = {"stand_in": args.stand_in_model, "clock": time.thread_time if args.cpu_clock else time.perf_counter}
        run(loaded, path, workload, "v0", **options)  # warm-up: torch's first calls at these shapes are slow
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        step_us: dict[str, list[float]] = {mode: [] for mode in modes}
        no_append_us: dict[str, list[float]] = {mode: [] for mode in modes}
        vllm_step_us: list[float] = []
        for pair in range(args.pairs):
            texts = {}
            for mode in (modes if pair % 2 == 0 else modes[::-1]):
                elapsed, texts[mode], clock = run(loaded, path, workload, mode, **options)
                rates[mode].append(num_tokens / elapsed)
                step_us[mode].append(1e6 * clock.seconds / clock.steps)
                no_append_us[mode].append(1e6 * (clock.seconds - clock.append_seconds) / clock.steps)
                if get_design(mode) is VLLM:
                    vllm_step_us.append(1e6 * clock.vllm_seconds / clock.steps)
                print(f"  round {pair + 1} {mode:4}: {rates[mode][-1]:7.1f} tok/s, scheduler "
                      f"{step_us[mode][-1]:7.1f} us/step ({no_append_us[mode][-1]:7.1f} without the token appends) "
                      f"over {clock.steps} steps")
            assert all(texts[mode] == texts["v0"] for mode in modes), "the modes generated different tokens"

    def ratio(a: str, b: str) -> float:
        return statistics.median(y / x for x, y in zip(rates[a], rates[b]))

    print(f"workload: {args.requests} requests, {num_tokens:,} tokens, {args.layers} layers x {args.width} wide, "
          f"{args.pairs} rounds (same tokens in every mode)")
    names = {"v0": "v0 (BlockSpaceManager)", "v1": "v1 (KVCacheManager)", "vllm": "vllm (vLLM 0.33's own)"}
    for mode in modes:
        print(f"{names[mode]:24} {statistics.median(rates[mode]):7.1f} tok/s   scheduler "
              f"{statistics.median(step_us[mode]):8.1f} us/step, {statistics.median(no_append_us[mode]):8.1f} "
              f"without the token appends")
    print(f"v1 / v0:                 {ratio('v0', 'v1'):7.3f}x tok/s")
    figures = {"v0 tokens/s": statistics.median(rates["v0"]), "v1 tokens/s": statistics.median(rates["v1"]),
               "v1 / v0": ratio("v0", "v1"), "v0 scheduler us/step": statistics.median(step_us["v0"]),
               "v1 scheduler us/step": statistics.median(step_us["v1"]),
               "v0 scheduler us/step without appends": statistics.median(no_append_us["v0"]),
               "v1 scheduler us/step without appends": statistics.median(no_append_us["v1"])}
    if VLLM.name in modes:
        print(f"vllm / v1:               {ratio('v1', 'vllm'):7.3f}x tok/s")
        print(f"  of vllm's scheduler time per step, inside vLLM's own schedule + update_from_output: "
              f"{statistics.median(vllm_step_us):.1f} us")
        figures.update({"vllm tokens/s": statistics.median(rates["vllm"]), "vllm / v1": ratio("v1", "vllm"),
                        "vllm scheduler us/step": statistics.median(step_us["vllm"]),
                        "vllm scheduler us/step without appends": statistics.median(no_append_us["vllm"]),
                        "vllm own schedule+update us/step": statistics.median(vllm_step_us)})
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0

if __name__ == "__main__":
    sys.exit(main())

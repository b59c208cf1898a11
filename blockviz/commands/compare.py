"""`blockviz compare --block-size 4,16 --num-gpu-blocks 32,64 --prefix-caching on,off [--prompt ... |
--workload FILE]`: what a setting changes. One workload runs through the real engine once per
configuration (every combination of the values given, the model loaded once), and the runs are
shown side by side: steps, peak blocks in use, token utilization at the peak, prefix-cache hit
rate, preemptions, tokens/s, the device pool at the same step, and whether the text matches the
first configuration's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from blockviz.cli import DEFAULT_PROMPTS, UsageError, _int_at_least, add_engine_options

SWEPT = ("block_size", "num_gpu_blocks", "enable_prefix_caching")


def _ints(name: str):
    one = _int_at_least(name, 1)

    def parse(text: str) -> list[int]:
        return [one(part.strip()) for part in text.split(",") if part.strip()] or [one(text)]

    return parse


def _switches(text: str) -> list[bool]:
    values = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [values[part.strip().lower()] for part in text.split(",")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"--prefix-caching takes on, off or on,off; got {text!r}") from None


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="run one workload under several settings and compare the runs side by side",
        description="Run the same prompts through the engine once per combination of the settings given "
                    "as comma-separated lists, and print their figures side by side.")
    add_engine_options(parser, skip=SWEPT, max_tokens=16)  # these three take lists here:
    parser.add_argument("--block-size", type=_ints("--block-size"), default=[16], help="e.g. 4,16")
    parser.add_argument("--num-gpu-blocks", type=_ints("--num-gpu-blocks"), default=[None],
                        help="e.g. 32,64 (default: from the memory budget)")
    parser.add_argument("--prefix-caching", dest="enable_prefix_caching", type=_switches, default=[False],
                        help="on, off or on,off")
    parser.add_argument("--workload", type=Path, metavar="FILE", help="a text file, one prompt a line")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def execute(args) -> int:
    from blockviz.live import EngineSpec, check_model, one_line, quiet_model_loading

    prompts = _prompts(args)
    if args.workload is not None:
        args.prompts = prompts
    spec = EngineSpec.from_args(_first(args))
    spec.check()
    try:
        check_model(spec.model)
    except (OSError, ValueError) as exc:
        raise UsageError(one_line(exc)) from None
    quiet_model_loading()
    from engine.llm_engine import LLMEngine
    from engine.model_loader import load_model

    try:
        loaded = load_model(spec.model, spec.config.device)
        runs = [_run(LLMEngine(config, loaded=loaded), prompts, spec.sampling_params())
                for config in _configs(args, spec.config)]
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None
    at_step = min(run["steps"] for run in runs) // 2 or 1
    first_texts = runs[0]["texts"]
    for run in runs:
        run["same_text_as_first"] = run.pop("texts") == first_texts
        run["gpu_used_at_step"] = run.pop("_used_by_step").get(at_step)
    if args.json:
        print(json.dumps({"at_step": at_step, "runs": runs}, indent=2))
    else:
        _print_table(runs, at_step)
    return 0


def _prompts(args) -> list[str]:
    if args.workload is None:
        return list(args.prompts or DEFAULT_PROMPTS)
    try:
        lines = [line for line in args.workload.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--workload {str(args.workload)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not lines:
        raise UsageError(f"--workload {str(args.workload)!r} has no prompt (one a line)")
    return lines


def _first(args) -> argparse.Namespace:
    """The options with the first value of each swept setting (for the checks and the sampling)."""
    first = argparse.Namespace(**vars(args))
    for name in SWEPT:
        setattr(first, name, getattr(args, name)[0])
    return first


def _configs(args, base):
    from dataclasses import replace

    for values in itertools.product(*(getattr(args, name) for name in SWEPT)):
        yield replace(base, **dict(zip(SWEPT, values)))


def _run(engine, prompts: list[str], params) -> dict:
    """One run of the workload: its figures (generate's Recorder over its events) and its texts."""
    from blockviz.commands.generate import Recorder
    from engine.llm import LLM

    header = engine.trace_header()
    recorder = Recorder(header)
    engine.events.subscribe(recorder)
    start = time.perf_counter()
    outputs = LLM.from_engine(engine).generate(prompts, params)
    seconds = time.perf_counter() - start
    state, config = recorder.state, engine.config
    return {
        "block_size": config.block_size, "num_gpu_blocks": header["num_gpu_blocks"],
        "prefix_caching": config.enable_prefix_caching, "steps": engine.num_steps,
        "peak_blocks": recorder.peak_used, "token_utilization_at_peak": round(recorder.token_utilization_at_peak, 4),
        "prefix_hit_rate": round(state.prefix_hit_rate(), 4), "preemptions": state.num_preemptions,
        "tokens": state.num_tokens_generated, "tokens_per_s": round(state.num_tokens_generated / seconds, 1),
        "texts": [[c.text for c in output.outputs] for output in outputs], "_used_by_step": recorder.used_by_step,
    }


def _print_table(runs: list[dict], at_step: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"one workload, {len(runs)} configurations (GPU pool in use at step {at_step}; "
                        "token utilization at the peak; text the same as the first run's)", title_justify="left")
    for column in ("block", "pool", "cache", "steps", "peak", "util", "hits", "preempt", "tok/s",
                   f"@{at_step}", "same"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(str(run["block_size"]), str(run["num_gpu_blocks"]), "on" if run["prefix_caching"] else "off",
                      str(run["steps"]), str(run["peak_blocks"]), f"{run['token_utilization_at_peak']:.0%}",
                      f"{run['prefix_hit_rate']:.0%}", str(run["preemptions"]), f"{run['tokens_per_s']:,.0f}",
                      str(run["gpu_used_at_step"]), "yes" if run["same_text_as_first"] else "no")
    Console(highlight=False).print(table)

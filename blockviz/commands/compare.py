"""`blockviz compare --block-size 4,16 --num-gpu-blocks 32,64 --prefix-caching on,off [--prompt ... |
--workload FILE]`: what a setting changes. One workload runs through the real engine once per
configuration (every combination of the values given, the model loaded once), and the runs are
shown side by side: steps, peak blocks in use, token utilization at the peak, prefix-cache hit
rate, preemptions, tokens/s, the device pool at the same step, and whether the text matches the
first configuration's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blockviz.cli import DEFAULT_PROMPTS, UsageError, _int_at_least, add_engine_options

from blockviz.session.compare import SWEPT


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
    parser.add_argument("--tui", action="store_true",
                        help="show the runs side by side in the terminal, their pools at the same engine step")
    parser.add_argument("--projector", action="store_true", help="with --tui: big cells, high contrast")


def execute(args) -> int:
    from blockviz.session.compare import configurations, run_all, same_step
    from blockviz.session.spec import EngineSpec, one_line, quiet_model_loading

    prompts = _prompts(args)
    if args.workload is not None:
        args.prompts = prompts
    spec = EngineSpec.from_args(_first(args))
    spec.check_all()
    quiet_model_loading()
    configs = configurations(spec.config, **{name: getattr(args, name) for name in SWEPT})
    try:
        runs = run_all(prompts, configs, spec.sampling_params(), progress=_progress(args, len(configs)))
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None
    if args.tui:
        from blockviz.tui.compare_app import CompareApp

        CompareApp(runs, projector=args.projector).run()
        return 0
    at_step = same_step(runs)
    rows = [dict(run.figures, gpu_used_at_step=run.used_by_step.get(at_step)) for run in runs]
    if args.json:
        print(json.dumps({"at_step": at_step, "runs": rows}, indent=2))
    else:
        _print_table(rows, at_step)
    return 0


def _progress(args, total: int):
    """A line on stderr per configuration while they run (a terminal only, and never with --json)."""
    if args.json or not sys.stderr.isatty():
        return None
    return lambda index, config: print(
        f"run {index + 1}/{total}: block size {config.block_size}, "
        f"{config.num_gpu_blocks or 'budgeted'} GPU blocks, prefix caching "
        f"{'on' if config.enable_prefix_caching else 'off'} ...", file=sys.stderr, flush=True)


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

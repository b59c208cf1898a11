"""`blockviz compare --kv-manager v0,v1 --block-size 4,16 --num-gpu-blocks 32,64 --prefix-caching on,off
[--prompt ... | --workload FILE]`: what a setting changes. One workload runs through the real engine
once per configuration (every combination of the values given, and only of those; the model loaded
once), and the runs are shown side by side: steps, peak blocks in use, token utilization at the
peak, prefix-cache hits, forks and copies on write, preemptions and the tokens they made the engine
compute again, the device pool at the same step, and whether the text matches the first
configuration's; per request, the prefix hit in tokens under each run (and when a radix tree's
smaller pages served tokens of a block the other could not share, that it did), the free space when
it was admitted as each design counts it (blockviz/model/free_space.py) and what was evicted for it
and when; then which of those figures differ. No tokens/s: see blockviz/session/compare.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from blockviz.commands.options import _sglang_option, add_engine_options, int_at_least
from blockviz.errors import UsageError
from blockviz.session.compare import DEFAULT_PROMPTS, SWEPT, figure_text, partial_hit_note, run_name


def _ints(name: str):
    one = int_at_least(name, 1)

    def parse(text: str) -> list[int]:
        return [one(part.strip()) for part in text.split(",") if part.strip()] or [one(text)]

    return parse


def _switches(text: str) -> list[bool]:
    values = {"on": True, "off": False, "true": True, "false": False}
    try:
        return [values[part.strip().lower()] for part in text.split(",")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"--prefix-caching takes on, off or on,off; got {text!r}") from None


def _managers(text: str) -> list[str]:
    from engine.config import KV_MANAGERS

    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(name not in KV_MANAGERS for name in names):
        raise argparse.ArgumentTypeError(f"--kv-manager takes {', '.join(KV_MANAGERS)} or v0,v1; got {text!r}")
    return names


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="run one workload under several settings and compare the runs side by side",
        description="Run the same prompts through the engine once per combination of the settings given "
                    "as comma-separated lists (a setting not given keeps its default: one value), and print "
                    "their figures side by side and which of them differ.")
    add_engine_options(parser, skip=SWEPT, max_tokens=16,  # these four take lists here:
                       prompts_help="two lines of ROMEO's that share their opening")
    parser.add_argument("--kv-manager", type=_managers, default=["v0"],
                        help="v0, v1, vllm, sglang or a list such as v0,v1 or vllm,sglang: vLLM v0's block manager, v1's KV cache "
                             "manager, vLLM's own scheduler (docs/vllm-core.md), SGLang's radix cache (docs/sglang.md), side by side")
    parser.add_argument("--block-size", type=_ints("--block-size"), default=[16], help="e.g. 4,16")
    parser.add_argument("--num-gpu-blocks", type=_ints("--num-gpu-blocks"), default=[None],
                        help="e.g. 32,64 (default: from the memory budget)")
    parser.add_argument("--prefix-caching", dest="enable_prefix_caching", type=_switches, default=[None],
                        help="on, off or on,off (default: each manager's own, off in v0 and on in v1)")
    parser.add_argument("--sglang-option", action="append", type=_sglang_option, dest="sglang_options",
                        metavar="KEY=VALUE", help="for the sglang runs only: an SGLang server argument, e.g. "
                                                  "page_size=1 (docs/sglang.md); repeatable")
    parser.add_argument("--workload", type=Path, metavar="FILE", help="a text file, one prompt a line")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--tui", action="store_true",
                        help="show the runs side by side in the terminal, their pools at the same engine step")
    parser.add_argument("--projector", action="store_true", help="with --tui: big cells, high contrast")


def execute(args) -> int:
    from blockviz.session.compare import differences, same_step, why_lines

    runs = compare_runs(args)
    if args.tui:
        from blockviz.tui.compare_app import CompareApp

        CompareApp(runs, projector=args.projector).run()
        return 0
    at_step = same_step(runs)
    rows = [dict(run.figures, gpu_used_at_step=run.used_by_step.get(at_step)) for run in runs]
    differ = differences(runs)
    if args.json:
        print(json.dumps({"at_step": at_step, "runs": rows, "differences": dict(differ), "why": why_lines(runs)},
                         indent=2))
    else:
        _print_table(rows, at_step)
        _print_hits(rows, prompts_of(args))
        _print_differences(differ, len(runs))
        for line in why_lines(runs):  # a figure that looks wrong, explained
            print(textwrap.fill(line, width=100, subsequent_indent="  "))
    return 0


def compare_runs(args) -> list:
    """The parsed options' runs (session.compare.run_all), or UsageError (one line) before or while
    they run: what `execute` shows as a table, JSON or the split view."""
    from blockviz.session.compare import configurations, run_all
    from blockviz.session.spec import EngineSpec, one_line, quiet_model_loading

    prompts = _prompts(args)
    if args.workload is not None:
        args.prompts = prompts
    sglang_options = dict(args.sglang_options or ())
    from engine.designs import get_design

    if sglang_options and not any(get_design(name).radix_tree for name in args.kv_manager):
        raise UsageError("--sglang-option applies to --kv-manager sglang only")
    spec = EngineSpec.from_args(argparse.Namespace(**{**vars(_first(args)), "sglang_options": None}))
    spec.check_all()
    quiet_model_loading()
    try:
        configs = configurations(spec.config, sglang_options or None, **{name: getattr(args, name) for name in SWEPT})
        return run_all(prompts, configs, spec.sampling_params(), progress=_progress(args, len(configs)))
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None


def _progress(args, total: int):
    """A line on stderr per configuration while they run (a terminal only, and never with --json)."""
    if args.json or not sys.stderr.isatty():
        return None
    return lambda index, config: print(
        f"run {index + 1}/{total}: {config.kv_manager}, block size {config.block_size}, "
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


SETTINGS = (("kv_manager", "kv", str), ("block_size", "block", str), ("num_gpu_blocks", "pool", str),
            ("prefix_caching", "cache", lambda on: "on" if on else "off"))


def _print_table(runs: list[dict], at_step: int) -> None:
    """One row per run: the settings that vary (the others in the title), then the figures; plain
    columns as wide as their widest cell, so nothing is cut at any terminal width."""
    varying = [s for s in SETTINGS if len({repr(run[s[0]]) for run in runs}) > 1]
    fixed = ", ".join(f"{name} {shown(runs[0][key])}" for key, name, shown in SETTINGS if (key, name, shown) not in varying)
    header = [name for _, name, _ in varying] + ["steps", "peak", "util", "hits", "hit%", "forks", "cow", "preempt",
                                                 "recomp", f"@{at_step}", "same"]
    rows = [[shown(run[key]) for key, _, shown in varying]
            + [str(run["steps"]), str(run["peak_blocks"]), f"{run['token_utilization_at_peak']:.0%}",
               str(run["prefix_hits"]), f"{run['prefix_hit_rate']:.0%} {run['prefix_hit_unit'][:3]}", str(run["forks"]), str(run["copies_on_write"]),
               str(run["preemptions"]), str(run["tokens_recomputed"]), str(run["gpu_used_at_step"]),
               "yes" if run["same_text_as_first"] else "no"] for run in runs]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    print(f"one workload, {len(runs)} configurations ({fixed})")
    for row in (header, *rows):
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
    print(textwrap.fill(
        f"peak: most GPU blocks in use; util: token utilization then; hits: prompt blocks found in the prefix "
        f"cache; hit%: hits over lookups, of prompt blocks (blo: v0) or of tokens (tok: v1, as vLLM's "
        f"PrefixCacheStats); forks, cow: forks and copies on write; recomp: tokens computed again after preemptions; "
        f"@{at_step}: GPU blocks in use after step {at_step}; same: the same text as the first run", width=100))


def prompts_of(args) -> list[str]:
    return list(args.prompts or DEFAULT_PROMPTS)


def _print_hits(runs: list[dict], prompts: list[str]) -> None:
    """Per request, the prompt tokens each run found in its prefix cache; when a radix-tree run
    (SGLang's, shared per page_size tokens) found more than a run of whole blocks, the line says so.
    Under it, per run, the GPU's free space as that design counts it when the request was admitted
    and what was evicted for it (session.compare.RequestMoments)."""
    names = [run_name(run) for run in runs]
    print("prefix hit per request, in tokens (" + " | ".join(names) + "), then per run: free space when it was "
          "admitted, as that design counts it, and what was evicted for it:")
    for index, prompt in enumerate(prompts):
        hits = [run["hit_tokens"][index] if index < len(run["hit_tokens"]) else 0 for run in runs]
        shown = prompt if len(prompt) <= 40 else prompt[:39] + "…"
        note = partial_hit_note(runs, index)
        print(f"  r{index} {shown!r}: " + " | ".join(map(str, hits)) + (f"  {note}" if note else ""))
        for name, run in zip(names, runs):
            if "free_at_admission" in run and index < len(run["free_at_admission"]):
                print(f"      {name}: {_moments_text(run, index)}")


def _moments_text(run: dict, index: int) -> str:
    """A request's free space at admission and evictions in one run, in words."""
    from blockviz.model.free_space import FreeSpace
    from engine.designs import get_design

    free = run["free_at_admission"][index]
    admitted = ("never admitted" if free is None
                else f"at its admission step {FreeSpace.from_json(free, run['block_size']).line()}")
    unit = "page" if get_design(run["kv_manager"]).radix_tree else "block"
    evicted = "; ".join(f"evicted {blocks} {unit}{'s' if blocks != 1 else ''} ({tokens} tokens) at step {step}"
                        for step, blocks, tokens in run["evicted"][index]) or "evicted nothing"
    return f"{admitted}; {evicted}"


def _print_differences(differ: list[tuple[str, list]], num_runs: int) -> None:
    """Which figures the settings changed, one line each in the rows' order (or that none did)."""
    if num_runs < 2:
        return
    if not differ:
        print("the runs' figures are the same")
        return
    print("what differs, in the rows' order:")
    for name, values in differ:
        print(f"  {name}: " + " | ".join(map(figure_text, values)))


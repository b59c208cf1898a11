"""`blockviz record --out FILE.jsonl [--scenario NAME] [engine options]`: run the engine with no UI,
write a trace.

`--scenario` records a story as `blockviz run` plays it (blockviz/session/scenario.py: "story", its
v1 form under --kv-manager v1, SGLang's under --kv-manager sglang, "story-v1", "story-hybrid",
"story-cpu-tier", "story-sglang"): the story's arrivals on
its settings, each engine option given overriding the story's (EngineSpec.for_scenario), so
`record --scenario story --kv-manager v1` writes what `run --kv-manager v1` shows.

The trace is a header line (format "blockviz-trace", version, blockviz version, model, block size,
pool sizes, prefix caching, prompts, n, max_tokens, seed) then one event per line; see
blockviz/model/trace.py. Progress goes to stderr. The file appears only once the run is complete.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from blockviz.commands.options import add_engine_options
from blockviz.errors import UsageError
from blockviz.session.spec import ENGINE_CONFIG_OPTIONS

# The engine options' destinations (options.add_engine_options): EngineConfig's and the requests'.
ENGINE_DESTS = (*ENGINE_CONFIG_OPTIONS, "prompts", "n", "max_tokens", "temperature", "vllm_options", "sglang_options")


@dataclass(slots=True)
class Recording:
    """What a recording produced: the header, how many events and steps, and the state a reducer
    subscribed to the engine built during the run (tests compare it with a replay)."""

    header: dict[str, Any]
    num_events: int
    num_steps: int
    state: Any


class TraceRejected(RuntimeError):
    """The trace a run wrote fails the trace checker its readers run: it is kept aside, not published."""


def record_trace(spec, out: str | Path, *, engine=None, progress: Callable[[str], None] | None = None,
                 between_steps: Callable[[Any, int], None] | None = None,
                 extra_header: dict[str, Any] | None = None, max_steps: int = 100_000,
                 overwrite: bool = True, publishing: Callable[[], ContextManager] = contextlib.nullcontext) -> Recording:
    """Run `spec`'s requests to completion in an engine session (on `engine`, built from spec when
    None) and write the trace to `out`. `between_steps(session, steps_done)` may act on the
    engine through the session (add a request, fork, preempt); `extra_header` adds fields to the
    header (a scenario's name and description).

    Every prompt is checked before the run (a ValueError names the bad one). The file appears only
    when every request has finished: a run cut short (an error, Ctrl-C, `max_steps` reached with
    work left) raises and leaves no trace behind. An existing `out` is replaced only if `overwrite`
    (else a TraceError); before that the file is read back through the trace checker
    (TraceWriter.verify), as replay, export and the notebook read it: a trace they would refuse is
    kept aside as NAME.rejected.jsonl and TraceRejected (one line) says which line fails and why.
    The trace is fsync'ed before it is renamed into place, inside `publishing()` (the CLI holds
    SIGINT and SIGTERM there: blockviz/commands/signals.py)."""
    from blockviz.model.trace import TraceError, TraceWriteError, TraceWriter, make_header
    from blockviz.model.reducer import ReducerState
    from blockviz.session.engine_session import EngineSession

    session = EngineSession(spec, engine=engine)
    header = make_header(session.header, **spec.run_header(), **(extra_header or {}))
    state = ReducerState.from_header(header)
    writer = TraceWriter.create(out, header, overwrite=overwrite)

    def write(batch) -> None:
        try:
            writer.write_all(batch)
        except OSError as exc:  # a full disk (ENOSPC), a file-size limit (EFBIG): one line, no file left
            raise TraceError(f"cannot write {str(out)!r}: {exc.strerror or exc}; no trace written") from None
        state.apply_all(batch)

    def report(steps_done: int) -> None:
        if progress is not None:
            progress(f"step {steps_done}: {writer.num_events} events")

    try:
        session.start()  # checks every request first: a ValueError names the one refused
        session.run_to_completion(max_steps, on_events=write, between_steps=between_steps, progress=report)
        if session.has_unfinished_requests():
            raise RuntimeError(f"the run had not finished after {max_steps} steps; no trace written")
    except BaseException:
        writer.discard()
        raise
    finally:
        session.close()
    try:
        writer.verify()
    except TraceWriteError:
        raise
    except TraceError as exc:
        rejected = writer.set_aside()
        raise TraceRejected(f"the recorded trace fails the check its readers run ({exc}); kept aside as "
                            f"{str(rejected)!r}, no trace written to {str(out)!r}") from None
    except BaseException:  # a signal while it is read back: nothing is left behind
        writer.discard()
        raise
    with publishing():
        writer.commit()
    return Recording(header, writer.num_events, session.num_steps, state)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "record", help="run the engine without a UI and write its events to a trace file",
        description="Run the engine to completion with no UI and write every event to a JSON-lines "
                    "trace that `blockviz replay` opens without a model.")
    parser.add_argument("--out", required=True, metavar="FILE.jsonl", help="where to write the trace")
    parser.add_argument("--force", action="store_true", help="overwrite --out (and --html) if it exists")
    parser.add_argument("--html", metavar="FILE", help="also write one .html page that plays the run offline "
                                                       "(as `blockviz export TRACE --html FILE`)")
    from blockviz.session.scenario import DEFAULT_SCENARIO_OPTIONS, SCENARIOS

    parser.add_argument("--scenario", choices=sorted(SCENARIOS),
                        help="record a story as `blockviz run` plays it, on the story's settings (an engine option "
                             "given overrides the story's): story (v0's; v1's under --kv-manager v1, the CPU tier's "
                             "under --kv-manager vllm --kv-offloading-size, SGLang's under --kv-manager sglang), story-v1, "
                             "story-hybrid, story-cpu-tier, story-sglang")
    # `blockviz run`'s pools, so a trace replays as a grid one can take in at a glance
    pools = {k: DEFAULT_SCENARIO_OPTIONS[k] for k in ("num_gpu_blocks", "num_cpu_blocks")}
    add_engine_options(parser, **pools)
    # An engine option left out is absent from the parsed options, so --scenario can tell the
    # options given (they override the story's) from the defaults (filled in by `engine_args`).
    parser.set_defaults(engine_defaults={dest: parser.get_default(dest) for dest in ENGINE_DESTS})
    for action in parser._actions:  # argparse has no public way to set an action's default alone
        if action.dest in ENGINE_DESTS:
            action.default = argparse.SUPPRESS



def engine_args(args) -> argparse.Namespace:
    """The parsed options with every engine option left out at its default."""
    return argparse.Namespace(**{**args.engine_defaults, **vars(args)})


def scenario_spec(name: str, args):
    """The spec of `--scenario NAME`: the story's arrivals and settings, the engine options given on
    top (EngineSpec.for_scenario, as `blockviz run` picks the story of --kv-manager). A story's
    requests are its own: --prompt and --n are one line each."""
    from blockviz.session.spec import EngineSpec, one_line

    given = {dest: getattr(args, dest) for dest in ENGINE_DESTS if hasattr(args, dest)}
    if given.get("prompts"):
        raise UsageError(f"--scenario {name} plays the story's own requests: leave out --prompt (or --scenario)")
    if "n" in given:
        raise UsageError(f"--n applies to --prompt requests: --scenario {name} sets each request's own (leave out --n)")
    options = {k: v for k, v in given.items() if k not in ("prompts", "n")}
    if "vllm_options" in options:
        options["vllm_options"] = dict(options["vllm_options"] or ())
    if "sglang_options" in options:
        options["sglang_options"] = dict(options["sglang_options"] or ())
    try:
        return EngineSpec.for_scenario(name, **options)
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None


def execute(args) -> int:
    """Record, with SIGINT and SIGTERM stopping the run in one line: no trace is written (its
    partial file is removed) and the exit code is the shell's (130, 143); a signal that arrives
    while the finished trace is renamed into place lets it finish, and the line says it is whole."""
    from blockviz.commands.signals import StopOnSignals, Stopped

    with StopOnSignals() as stop:
        try:
            code = _record(args, stop)
        except Stopped as exc:
            end_progress = "\n" if sys.stderr.isatty() else ""
            print(f"{end_progress}blockviz: record stopped by {exc.name}: no trace written, nothing left behind",
                  file=sys.stderr)
            return exc.exit_code
    return code


def _record(args, stop) -> int:
    from blockviz.session.spec import EngineSpec, one_line, quiet_model_loading

    from blockviz.model.narration import plural
    from blockviz.model.trace import TraceError, check_new_trace_path

    out = Path(args.out)
    try:
        check_new_trace_path(out, overwrite=args.force)  # before the model loads; again at the rename
    except TraceError as exc:
        raise UsageError(f"--out {exc}") from None
    if args.html is not None:
        from blockviz.commands.export import check_html_path

        check_html_path(Path(args.html), overwrite=args.force)
    spec = scenario_spec(args.scenario, args) if args.scenario else EngineSpec.from_args(engine_args(args))
    spec.check_all()
    tty = sys.stderr.isatty()

    def progress(text: str) -> None:
        if tty:
            print(f"\rrecording: {text}", end="", file=sys.stderr, flush=True)

    quiet_model_loading()
    print(f"loading {spec.model!r}…", file=sys.stderr, flush=True)
    try:
        engine = spec.make_engine()
    except (OSError, ValueError) as exc:
        raise UsageError(one_line(exc)) from None
    try:
        recording = record_trace(spec, out, engine=engine, progress=progress, overwrite=args.force,
                                 extra_header={"scenario": args.scenario} if args.scenario else None,
                                 publishing=stop.finishing)
    except ValueError as exc:  # a prompt the engine refuses, --out taken meanwhile, a full disk: nothing written
        raise UsageError(one_line(exc)) from None
    except RuntimeError as exc:
        if tty:
            print(file=sys.stderr)
        print(f"blockviz: error: {one_line(exc)}", file=sys.stderr)
        return 1
    if tty:
        print(file=sys.stderr)
    recorded = f"recorded {plural(recording.num_events, 'event')} over {plural(recording.num_steps, 'step')} to {out}"
    if stop.signum is not None:  # it came while the finished trace was renamed into place
        name = signal.Signals(stop.signum).name
        print(f"{recorded} ({name} arrived as it was saved: the trace is whole)", file=sys.stderr)
        return 128 + stop.signum
    print(recorded, file=sys.stderr)
    if args.html is not None:
        from blockviz.commands.export import html_of_trace

        print(html_of_trace(out, Path(args.html), overwrite=args.force), file=sys.stderr)
    return 0
